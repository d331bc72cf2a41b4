"""Bad requests get OpenAI's error JSON with the right status, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

OK_MESSAGES = [{"role": "user", "content": "hi"}]


def _post(server, path: str, **kw) -> httpx.Response:
    return httpx.post(server.v1 + path, timeout=30, **kw)


def _assert_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_malformed_json_is_400(server) -> None:
    r = _post(
        server,
        "/chat/completions",
        content=b'{"model": "tiny", "messages": [',
        headers={"content-type": "application/json"},
    )
    _assert_error(r, 400)


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_json_body_sent_without_the_json_content_type_is_a_400_that_says_so(server, content_type) -> None:
    """`curl -d '{...}'` without `-H 'Content-Type: application/json'` sends form-encoded: FastAPI does not read the
    body as JSON then, and the 400 said only "Input should be a valid dictionary or object to extract fields from"."""
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    for path in ("/chat/completions", "/completions", "/responses"):
        headers = {} if content_type is None else {"content-type": content_type}
        err = _assert_error(_post(server, path, content=body, headers=headers), 400)
        assert "Content-Type: application/json" in err["message"], err
        assert (content_type or "no Content-Type") in err["message"], err
    ok = _post(server, "/chat/completions", content=body, headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text


def test_a_body_that_is_json_but_not_an_object_is_a_400_that_says_so(server) -> None:
    for body in (b"[1, 2]", b"null", b'"text"', b"3", b""):
        err = _assert_error(
            _post(server, "/chat/completions", content=body, headers={"content-type": "application/json"}), 400
        )
        assert "JSON object" in err["message"], err
    # a check of the whole object keeps its own message
    err = _assert_error(_post(server, "/completions", json={"model": "tiny", "prompt": [], "max_tokens": 2}), 400)
    assert "prompt must not be an empty list" in err["message"] and err["param"] == "prompt", err


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": "tiny", "messages": OK_MESSAGES, "max_tokens": -1}, "max_tokens"),
        ({"model": "tiny", "messages": OK_MESSAGES, "temperature": 9}, "temperature"),
        ({"model": "tiny", "messages": OK_MESSAGES, "top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"model": "tiny", "messages": OK_MESSAGES, "top_logprobs": 21}, "top_logprobs"),
        ({"model": "tiny", "messages": OK_MESSAGES, "frobnicate": 1}, "frobnicate"),  # unknown: never ignored
        ({"model": "tiny", "messages": OK_MESSAGES, "tools": [{"type": "function"}]}, "tools.0.function"),
        ({"model": "tiny", "messages": OK_MESSAGES, "tool_choice": "auto"}, "tool_choice"),  # without tools
        ({"model": "tiny", "messages": OK_MESSAGES, "tool_choice": "sometimes"}, "tool_choice"),
        ({"model": "tiny", "messages": OK_MESSAGES, "response_format": {"type": "xml"}}, "response_format.type"),
        ({"model": "tiny", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
        ({"model": "tiny", "messages": OK_MESSAGES, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "tiny", "messages": OK_MESSAGES, "logit_bias": {"abc": 1}}, "logit_bias"),
        ({"model": "tiny", "messages": OK_MESSAGES, "logit_bias": {"5": 101}}, "logit_bias"),
        ({"model": "tiny", "messages": OK_MESSAGES, "presence_penalty": 3}, "presence_penalty"),
        ({"model": "tiny", "messages": OK_MESSAGES, "min_p": 1.5}, "min_p"),
        ({"model": "tiny", "messages": OK_MESSAGES, "cache_salt": ""}, "cache_salt"),
        ({"model": "tiny", "messages": OK_MESSAGES, "timeout": 0}, "timeout"),
        (
            {"model": "tiny", "messages": OK_MESSAGES, "stream_options": {"continuous": True}},
            "stream_options.continuous",
        ),
        ({"model": "tiny"}, "messages"),
    ],
)
def test_invalid_chat_requests_are_400(server, body: dict, param: str) -> None:
    assert _assert_error(_post(server, "/chat/completions", json=body), 400)["param"] == param


def test_prompt_over_the_context_length_is_400(server) -> None:
    r = _post(server, "/completions", json={"model": "tiny", "prompt": "x" * 5000})
    assert _assert_error(r, 400)["code"] == "context_length_exceeded"


def test_wrong_model_is_404_through_the_sdk_too(server, client) -> None:
    err = _assert_error(_post(server, "/chat/completions", json={"model": "gpt-4o", "messages": OK_MESSAGES}), 404)
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=1)


def test_server_keeps_serving_after_errors(server, client) -> None:
    for _ in range(3):
        _post(server, "/chat/completions", content=b"not json", headers={"content-type": "application/json"})
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    r = client.chat.completions.create(model="tiny", messages=OK_MESSAGES, max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


@pytest.mark.xdist_group("overload_servers")  # conftest's POOL64_GROUP: the worker that runs pool64_server's tests
def test_prompt_larger_than_the_kv_pool_is_400_with_the_numbers(pool64_server) -> None:
    small = pool64_server  # 64 tokens of KV: 4 pages of 16
    r = _post(small, "/completions", json={"model": "tiny", "prompt": "y" * 200, "max_tokens": 2})
    err = _assert_error(r, 400)
    assert err["code"] == "context_length_exceeded"
    assert "64 tokens (4 pages of 16)" in err["message"] and "200 tokens (13 pages)" in err["message"]
    ok = _post(small, "/completions", json={"model": "tiny", "prompt": "short", "max_tokens": 2})
    assert ok.status_code == 200, ok.text
