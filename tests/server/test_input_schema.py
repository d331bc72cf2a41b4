"""Input is validated at the door by the protocol models' pydantic constraints: every out-of-range, non-finite,
oversized or over-long value is a 400 with OpenAI's error JSON whose `param` is the field's path, never a 500,
and the server then still answers a normal request with the same greedy output as before."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

M = [{"role": "user", "content": "hi"}]


def _chat(**kw) -> dict:
    return {"model": "tiny", "messages": M, **kw}


def _raw(text: str) -> bytes:
    return text.encode()  # NaN and Infinity are not JSON, but Python's parser reads them


CHAT_CASES = [
    (_chat(temperature=-0.1), "temperature"),
    (_chat(top_p=0), "top_p"),
    (_chat(top_p=1.5), "top_p"),
    (_chat(top_k=-1), "top_k"),
    (_chat(top_k=1 << 40), "top_k"),
    (_chat(repetition_penalty=1e-300), "repetition_penalty"),
    (_chat(repetition_penalty=0), "repetition_penalty"),
    (_chat(frequency_penalty=-2.5), "frequency_penalty"),
    (_chat(max_tokens=1 << 40), "max_tokens"),
    (_chat(max_completion_tokens=-1), "max_completion_tokens"),
    (_chat(n=0), "n"),
    (_chat(n=17), "n"),
    (_chat(seed=1 << 64), "seed"),
    (_chat(seed=-(1 << 64)), "seed"),
    (_chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (_chat(stop=["x" * 257]), "stop.0"),
    (_chat(stop="x" * 257), "stop"),
    (_chat(logit_bias={str(i): 1 for i in range(301)}), "logit_bias"),
    (_chat(logit_bias={"99999999999": 1}), "logit_bias"),
    (_chat(logit_bias={"٣": 1}), "logit_bias"),  # a digit, but not an ASCII token id
    (_chat(timeout=1e9), "timeout"),
    (_chat(user="u" * 257), "user"),
    (_chat(metadata={"k": "v" * 513}), "metadata.k"),
    (_chat(cache_salt="s" * 257), "cache_salt"),
    ({"model": "tiny", "messages": M * 4097}, "messages"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x" * ((1 << 21) + 1)}]}, "messages.0.content"),
    ({"model": "m" * 257, "messages": M}, "model"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_CASES, ids=[p + str(i) for i, (_, p) in enumerate(CHAT_CASES)])
def test_out_of_range_chat_fields_are_400_naming_the_path(server, body: dict, param: str) -> None:
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and param in err["message"]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model":"tiny","messages":[{"role":"user","content":"hi"}],"temperature":NaN}', "temperature"),
        ('{"model":"tiny","messages":[{"role":"user","content":"hi"}],"top_p":NaN}', "top_p"),
        ('{"model":"tiny","messages":[{"role":"user","content":"hi"}],"timeout":Infinity}', "timeout"),
        ('{"model":"tiny","messages":[{"role":"user","content":"hi"}],"logit_bias":{"5":NaN}}', "logit_bias.5"),
        (
            '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"presence_penalty":-Infinity}',
            "presence_penalty",
        ),
    ],
)
def test_non_finite_numbers_are_400(server, raw: str, param: str) -> None:
    r = httpx.post(
        server.v1 + "/chat/completions", content=_raw(raw), headers={"content-type": "application/json"}, timeout=60
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([-1], "prompt.0"),
        ([[1, 2], [3, -5]], "prompt.1.1"),
        ([1 << 40], "prompt.0"),
        (["a"] * 65, "prompt"),
        ("x" * ((1 << 21) + 1), "prompt"),
    ],
    ids=["negative", "negative-in-list", "huge-id", "65-prompts", "long-text"],
)
def test_bad_completion_prompts_are_400_naming_the_path(server, prompt, param: str) -> None:
    r = httpx.post(server.v1 + "/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tiny_temperature_is_greedy_and_the_server_keeps_serving(server) -> None:
    """A temperature of 1e-40 is valid (greedy, as vLLM treats anything under 1e-5): same output as 0."""
    body = {"model": "tiny", "prompt": "The cache", "max_tokens": 8}
    greedy = httpx.post(server.v1 + "/completions", json={**body, "temperature": 0}, timeout=60)
    tiny = httpx.post(server.v1 + "/completions", json={**body, "temperature": 1e-40}, timeout=60)
    assert greedy.status_code == tiny.status_code == 200, (greedy.text, tiny.text)
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
