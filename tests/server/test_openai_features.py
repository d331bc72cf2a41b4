"""What agent frameworks send, through the `openai` package against a real server: logprobs (checked against a
plain reference forward), logit_bias, penalties and min_p (checked against the engine run in this process), seeds,
a list of prompts, honest cached_tokens with n > 1, and cache_salt isolation with hashed per-namespace metrics."""

from __future__ import annotations

import json
import math
import uuid

import httpx
import openai
import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.reference import reference_logits

EOS = 256


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def fresh_ids(n: int) -> list[int]:
    """Token ids no other test sends (so nothing of them is cached)."""
    rng = torch.Generator().manual_seed(uuid.uuid4().int % 2**31)
    return torch.randint(1, 250, (n,), generator=rng).tolist()


def openai_text(raw: bytes) -> str:
    """A token's text as OpenAI's legacy logprobs write it: `bytes:\\xNN...` when it is part of a character."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def test_logprobs_match_a_softmax_of_the_reference_forward(client, loaded) -> None:
    prompt = fresh_ids(30)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    ids = list(prompt)
    for t in range(5):
        logprobs = torch.log_softmax(reference_logits(loaded.config, loaded.weights, ids)[-1].double(), dim=-1)
        chosen = int(torch.argmax(logprobs))
        if chosen == EOS:  # a final stop token has no logprob entry (nor text): the response ends before it
            assert len(lp.tokens) == t
            break
        assert lp.tokens[t] == openai_text(loaded.tokenizer.token_bytes(chosen))
        assert lp.token_logprobs[t] == pytest.approx(float(logprobs[chosen]), abs=1e-4)
        top = torch.topk(logprobs, 5)
        want_top: dict[str, float] = {}  # keyed by text: tokens that share one (ids past the vocabulary all decode
        for value, token_id in zip(top.values.tolist(), top.indices.tolist(), strict=True):  # to "") keep the
            want_top.setdefault(openai_text(loaded.tokenizer.token_bytes(token_id)), value)  # most likely's
        assert lp.top_logprobs[t].keys() == want_top.keys()
        assert list(lp.top_logprobs[t].values()) == pytest.approx(list(want_top.values()), abs=1e-4)
        ids.append(chosen)
    assert len(lp.text_offset) == len(lp.tokens) and lp.text_offset[:1] in ([], [0])  # empty if EOS came first


def test_chat_logprobs_have_openais_shape_and_a_stream_carries_the_same(client) -> None:
    messages = [{"role": "user", "content": f"logprobs please {uuid.uuid4().hex}"}]
    kw = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True}
    r = client.chat.completions.create(top_logprobs=3, logit_bias={str(EOS): -100}, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    assert b"".join(bytes(c.bytes) for c in content).decode(errors="replace") == r.choices[0].message.content
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) == 3
        whole = c.token if not c.token.startswith("bytes:") else None  # "bytes:\xNN": part of a character
        assert whole is None or c.bytes == list(whole.encode())
        assert c.top_logprobs[0].logprob >= c.logprob - 1e-6  # greedy: the chosen token is the most likely
    chunks = list(client.chat.completions.create(top_logprobs=3, logit_bias={str(EOS): -100}, stream=True, **kw))
    streamed = [
        c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content
    ]
    assert [c.token for c in streamed] == [c.token for c in content]  # the second run hits the cache: the
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-4)  # same, to 1e-4


def test_logit_bias_forces_a_token(client) -> None:
    r = client.completions.create(
        model="tiny", prompt=fresh_ids(10), max_tokens=6, temperature=0, logit_bias={"65": 100}, logprobs=0
    )
    tokens = r.choices[0].logprobs.tokens
    assert len(tokens) == 6 and len(set(tokens)) == 1


@pytest.mark.parametrize(
    "sampling",
    [
        {"frequency_penalty": 1.5},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 1.8},
        {"temperature": 0.9, "min_p": 0.2, "seed": 11},
        {"temperature": 1.0, "top_k": 5, "seed": 3, "frequency_penalty": 0.5},
    ],
)
def test_penalties_and_filters_give_what_the_engine_gives(client, loaded, sampling: dict) -> None:
    prompt = fresh_ids(20)
    kw = {"temperature": 0, **sampling}
    extra = {k: kw.pop(k) for k in ("top_k", "min_p", "repetition_penalty") if k in kw}
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, extra_body=extra, **kw)
    engine = Engine(loaded, capacity_blocks=64)
    want = engine.generate(prompt, 12, **kw, **extra)
    assert r.choices[0].text == want.text


def test_the_same_seed_reproduces_and_another_differs(client) -> None:
    prompt = fresh_ids(12)

    def sample(seed: int) -> str:
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=1.0, seed=seed)
        return r.choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_a_list_of_prompts_gets_n_choices_each_numbered_as_openai_does(client) -> None:
    prompts = [f"first {uuid.uuid4().hex}", f"second {uuid.uuid4().hex}"]
    r = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=5, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in r.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]
    single = [client.completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0) for p in prompts]
    assert [by_index[0], by_index[2]] == [s.choices[0].text for s in single]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)
    ids = client.completions.create(model="tiny", prompt=[fresh_ids(8), fresh_ids(9)], max_tokens=2)
    assert len(ids.choices) == 2 and ids.usage.prompt_tokens == 17


@pytest.mark.parametrize("stream", [False, True])
def test_n_samples_of_a_never_seen_prompt_report_no_cached_tokens(client, stream: bool) -> None:
    prompt = fresh_ids(40)
    kw = {"model": "tiny", "prompt": prompt, "n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 1}
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        usage = chunks[-1].usage
    else:
        usage = client.completions.create(**kw).usage
    assert usage.prompt_tokens == 40 and usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(**kw).usage
    assert again.prompt_tokens_details.cached_tokens == 32  # now it was there before: two whole pages of 16


def test_cache_salt_gives_keyless_callers_their_own_cache(server, client) -> None:
    prompt = fresh_ids(48)

    def cached(salt: str | None) -> int:
        extra = {} if salt is None else {"cache_salt": salt}
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, extra_body=extra)
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("alice-salt") == 0
    assert cached("bob-salt") == 0, "another salt never sees alice's pages"
    assert cached(None) == 0, "nor does a caller without a salt"
    assert cached("alice-salt") == 47 and cached("bob-salt") == 47 and cached(None) == 47  # all but the last
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert "alice-salt" not in metrics and "bob-salt" not in metrics
    labels = {
        line.split('namespace="')[1].split('"')[0]
        for line in metrics.splitlines()
        if line.startswith("radixcache_namespace_cached_tokens_total{")
    }
    assert "default" in labels and len(labels - {"default"}) >= 2
    assert all(label == "default" or (len(label) == 12 and int(label, 16) >= 0) for label in labels)


def test_unsupported_fields_are_named_and_user_and_metadata_are_accepted(client) -> None:
    ok = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="u-1", metadata={"k": "v"}
    )
    assert ok.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: frobnicate") as bad:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], extra_body={"frobnicate": True}
        )
    assert bad.value.param == "frobnicate"
    with pytest.raises(openai.BadRequestError, match="echo") as echo:
        client.completions.create(model="tiny", prompt="x", echo=True)
    assert echo.value.param == "echo"


def test_error_objects_are_json_with_no_500(server) -> None:
    bodies = [
        {"model": "tiny", "prompt": [], "max_tokens": 1},
        {"model": "tiny", "prompt": [[1, 2], []], "max_tokens": 1},
        {"model": "tiny", "prompt": [999999], "max_tokens": 1},
        {"model": "tiny", "prompt": ["a"] * 40, "n": 2, "max_tokens": 1},
        {"model": "tiny", "prompt": "x", "logprobs": 6},
        {"model": "tiny", "prompt": "x", "logit_bias": {"999999": 1}},
    ]
    for body in bodies:
        r = httpx.post(server.v1 + "/completions", json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert json.loads(r.text)["error"]["message"]
    assert math.isfinite(float(httpx.get(server.url + "/health/cache", timeout=10).json()["locked_blocks"]))


def test_a_final_stop_token_has_no_logprob_in_a_stream_either(client) -> None:
    kw = {"model": "tiny", "max_tokens": 4, "temperature": 0, "logprobs": True, "logit_bias": {str(EOS): 100}}
    messages = [{"role": "user", "content": f"stop at once {uuid.uuid4().hex}"}]
    whole = client.chat.completions.create(messages=messages, **kw)
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].logprobs.content == []
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kw))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert streamed == [] and [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
