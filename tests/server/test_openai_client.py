"""The server through the official `openai` package: chat, completions, streaming (`stream_options` as the package
types it), n > 1, usage from the cache, greedy outputs equal to Engine.chat's, and concurrent clients."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

SYSTEM = "You are a meticulous assistant who answers every question with care and precision. " * 4


def _chat(client, user: str, **kw):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return client.chat.completions.create(model="tiny", messages=messages, temperature=0, **{"max_tokens": 8, **kw})


def test_models_lists_the_served_name(client) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat_completion_has_openai_shape_and_usage(client) -> None:
    r = _chat(client, "What is a radix tree?")
    assert r.object == "chat.completion" and r.model == "tiny"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and 0 < u.completion_tokens <= 8


def test_second_request_sharing_a_long_system_prompt_reports_cached_tokens(client) -> None:
    _chat(client, "first question")
    r = _chat(client, "second, different question")
    assert r.usage.prompt_tokens_details.cached_tokens > len(SYSTEM) // 2


def test_greedy_output_equals_engine_chat(client, tiny_model_dir) -> None:
    from radixcache.runtime.engine.engine import Engine

    engine = Engine(str(tiny_model_dir), capacity_blocks=256)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "greedy please"}]
    expected = engine.chat(messages, 12, temperature=0.0)
    r = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
    assert r.choices[0].message.content == expected.text
    assert r.usage.completion_tokens == len(expected.token_ids)
    c = client.completions.create(model="tiny", prompt="abc def", temperature=0, max_tokens=12)
    assert c.choices[0].text == engine.generate("abc def", 12, temperature=0.0).text


def test_completions_endpoint(client) -> None:
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.usage.prompt_tokens == len("Once upon a time")
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_chat_stream_concatenates_to_the_whole_answer_and_ends_with_usage(client) -> None:
    whole = _chat(client, "stream me")
    chunks = list(_chat(client, "stream me", stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_stream_options_include_obfuscation_is_accepted_and_changes_nothing(client, endpoint: str) -> None:
    # The package types `include_obfuscation` in both endpoints' stream_options (a client turning it off to save
    # bandwidth); it was a 400 "Unrecognized request argument" here, though /v1/responses accepted it.
    def run(**options: bool) -> list:
        kw = {"model": "tiny", "max_tokens": 6, "temperature": 0, "stream": True, "stream_options": options}
        if endpoint == "chat":
            return list(client.chat.completions.create(messages=[{"role": "user", "content": "obfuscate?"}], **kw))
        return list(client.completions.create(prompt="obfuscate?", **kw))

    def text(chunks: list) -> str:
        pieces = (c.choices[0].delta.content if endpoint == "chat" else c.choices[0].text for c in chunks if c.choices)
        return "".join(p or "" for p in pieces)

    plain = run(include_usage=True)
    for flag in (False, True):
        chunks = run(include_usage=True, include_obfuscation=flag)
        assert text(chunks) == text(plain) and chunks[-1].usage.completion_tokens == plain[-1].usage.completion_tokens
        assert not any("obfuscation" in (c.model_extra or {}) for c in chunks)


def test_completion_stream(client) -> None:
    chunks = list(client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, stream=True))
    whole = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert all(c.usage is None for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_n_samples_share_a_fresh_prompt(client, stream: bool) -> None:
    kw = {"n": 3, "temperature": 1.0, "seed": 5, "max_tokens": 6}
    fresh = f"A preamble no earlier request sent (stream={stream}). " * 6  # ~300 tokens, nothing cached
    messages = [{"role": "system", "content": fresh}, {"role": "user", "content": "three samples"}]
    if not stream:
        r = client.chat.completions.create(model="tiny", messages=messages, **kw)
        assert sorted(c.index for c in r.choices) == [0, 1, 2] and r.usage.completion_tokens <= 18
        # One sample's prefill of the prompt is not a cache hit for the others (they share it in flight): cached
        # is what earlier requests left, at most the few pages of opening text this test's other case sends.
        assert r.usage.prompt_tokens_details.cached_tokens < 64 < r.usage.prompt_tokens
        return
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=messages, stream=True, stream_options={"include_usage": True}, **kw
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    usage = chunks[-1].usage
    assert finished == {0, 1, 2} and usage.completion_tokens <= 18
    assert usage.prompt_tokens_details.cached_tokens < 64 < usage.prompt_tokens


def test_sixteen_concurrent_clients_all_complete(client) -> None:
    def one(i: int) -> tuple[int, int]:  # half stream, half wait for the whole answer
        if i % 2:
            r = _chat(client, f"client {i} asks", max_tokens=None, max_completion_tokens=6)
            return r.usage.completion_tokens, r.usage.prompt_tokens_details.cached_tokens
        chunks = list(
            _chat(
                client,
                f"client {i} asks",
                max_tokens=None,
                max_completion_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        return chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens_details.cached_tokens

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert len(results) == 16 and all(1 <= n <= 6 for n, _ in results)
    assert sum(cached > 0 for _, cached in results) >= 8


def test_stop_strings_cut_the_text_like_the_engine(client, tiny_model_dir) -> None:
    from radixcache.runtime.engine.engine import Engine

    engine = Engine(str(tiny_model_dir), capacity_blocks=256)
    free = client.completions.create(model="tiny", prompt="stop here", max_tokens=12, temperature=0).choices[0].text
    stop = next((ch for ch in free[2:] if ch.isprintable() and ch != "\ufffd"), None)
    if stop is None:
        return
    r = client.completions.create(model="tiny", prompt="stop here", max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].text == engine.generate("stop here", 12, temperature=0.0, stop=[stop]).text
    assert stop not in r.choices[0].text and r.choices[0].finish_reason == "stop"
    chunks = client.completions.create(
        model="tiny", prompt="stop here", max_tokens=12, temperature=0, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
