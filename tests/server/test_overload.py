"""The server under overload and failure, as OpenAI's clients see it (a real server process, loopback only):
429 / 503 with Retry-After instead of an unbounded queue, a generation that outgrows the pool ends with
finish_reason "length" (streams too, then [DONE]), --max-model-len, per-request timeouts, and never a 500. After
every burst the cache's invariants hold and no block stays locked."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

# Under xdist one worker runs this module, so its module-scoped servers start once, not once per worker.
pytestmark = pytest.mark.xdist_group("overload_servers")

EOS = 256  # the tiny checkpoint's <|im_end|>
NO_EOS = {str(EOS): -100}  # generate to the length limit, whatever the random weights prefer


def prompt_ids(n: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 250 + 1 for i in range(n)]  # distinct byte tokens: no shared prefix


def settle(server, timeout: float = 60.0) -> dict:
    """Wait until the engine is idle; then the cache's own check, from the server."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(server.url + "/health/cache", timeout=30).json()
        if health["running"] == 0 and health["waiting"] == 0 and health["queued"] == 0:
            return health
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def assert_clean(server) -> None:
    health = settle(server)
    assert health["invariants"] == "ok"
    assert health["locked_blocks"] == health["pinned_blocks"] == 0 and health["held_blocks"] == 0
    assert health["free_blocks"] + health["evictable_blocks"] == health["capacity_blocks"]


def post(server, path: str, body: dict, stream: bool = False) -> tuple[int, dict, str]:
    """(status, headers, body text) of one request; a stream is read to its end."""
    with httpx.Client(timeout=120) as c, c.stream("POST", server.v1 + path, json=body) as r:
        return r.status_code, dict(r.headers), r.read().decode()


def sse_events(text: str) -> list:
    """The data of each SSE event, JSON-decoded except the final [DONE]."""
    out = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---------------------------------------------------------------------------------------------- bursts


@pytest.fixture(scope="module")
def small_pool(tiny_model_dir, launch):
    """A pool that holds 4 of the burst's requests at once (each needs 9 pages), 4 more may wait."""
    args = ("--capacity-blocks", "36", "--page-size", "16", "--max-queue", "4", "--queue-timeout", "20")
    with launch(tiny_model_dir, *args) as s:
        yield s


def burst(server, count: int, prompt_len: int, max_tokens: int) -> list[tuple[int, dict, str]]:
    def one(i: int) -> tuple[int, dict, str]:
        body = {"model": "tiny", "prompt": prompt_ids(prompt_len, i), "max_tokens": max_tokens, "temperature": 0}
        body["logit_bias"] = NO_EOS
        if i % 2:
            body["stream"] = True
        return post(server, "/completions", body, stream=bool(i % 2))

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_thirty_two_long_requests_on_a_pool_for_four_complete_or_get_told_when_to_retry(small_pool) -> None:
    answers = burst(small_pool, 32, prompt_len=100, max_tokens=40)
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429, 503}, statuses  # never a 500
    assert statuses.count(200) >= 4 and statuses.count(429) >= 1, statuses
    for status, headers, text in answers:
        if status == 200:
            body = sse_events(text)[-2] if text.startswith("data:") else json.loads(text)
            if text.startswith("data:"):
                assert text.rstrip().endswith("data: [DONE]")
            assert body["choices"][0]["finish_reason"] == "length"
            continue
        assert int(headers["retry-after"]) >= 1
        error = json.loads(text)["error"]
        assert error["code"] == ("queue_full" if status == 429 else "queue_timeout")
        assert "queue" in error["message"]
    assert_clean(small_pool)
    metrics = httpx.get(small_pool.url + "/metrics", timeout=10).text
    assert f'radixcache_http_errors_total{{status="429"}} {statuses.count(429)}' in metrics


def test_a_refused_stream_is_an_http_status_not_a_broken_stream(small_pool) -> None:
    answers = burst(small_pool, 16, prompt_len=100, max_tokens=40)
    refused = [(s, h, t) for s, h, t in answers if s != 200]
    assert refused, "16 at once cannot all be admitted or queued"
    for status, headers, text in refused:
        assert status in (429, 503) and headers["content-type"].startswith("application/json") and "error" in text
    assert_clean(small_pool)


@pytest.mark.slow
def test_queue_timeout_answers_503_with_retry_after(tiny_model_dir, launch) -> None:
    with launch(tiny_model_dir, "--capacity-blocks", "20", "--page-size", "16", "--queue-timeout", "0.05") as s:
        answers = burst(s, 12, prompt_len=100, max_tokens=60)
        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 503} and statuses.count(503) >= 1, statuses
        for status, headers, text in answers:
            if status == 503:
                assert int(headers["retry-after"]) >= 1 and json.loads(text)["error"]["code"] == "queue_timeout"
        assert_clean(s)


# ---------------------------------------------------------------------------------------------- the pool's end


@pytest.fixture
def tiny_pool(pool64_server):
    return pool64_server  # 64 tokens of KV, shared with test_errors (conftest.py)


def test_a_generation_that_outgrows_the_pool_ends_with_length_and_its_tokens(tiny_pool) -> None:
    client = openai.OpenAI(base_url=tiny_pool.v1, api_key="x", max_retries=0)
    r = client.completions.create(
        model="tiny", prompt=prompt_ids(40, 1), max_tokens=100, temperature=0, logit_bias=NO_EOS
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 64 - 40 + 1  # every position the pool holds, plus the last token sampled
    assert_clean(tiny_pool)


@pytest.mark.parametrize("endpoint", ["/completions", "/chat/completions"])
def test_a_stream_that_outgrows_the_pool_ends_with_length_then_done(tiny_pool, endpoint: str) -> None:
    body = {"model": "tiny", "max_tokens": 100, "temperature": 0, "logit_bias": NO_EOS, "stream": True}
    if endpoint == "/completions":
        body["prompt"] = prompt_ids(40, 2)
    else:
        body["messages"] = [{"role": "user", "content": "x" * 20}]
    status, _, text = post(tiny_pool, endpoint, body, stream=True)
    assert status == 200
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert_clean(tiny_pool)


@pytest.mark.slow
def test_max_model_len_bounds_prompt_and_completion(tiny_model_dir, launch) -> None:
    with launch(tiny_model_dir, "--capacity-blocks", "64", "--max-model-len", "64") as s:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 64") as long_prompt:
            client.completions.create(model="tiny", prompt=prompt_ids(70, 3), max_tokens=2)
        assert long_prompt.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError, match="50 in the prompt, 20 in the completion"):
            client.completions.create(model="tiny", prompt=prompt_ids(50, 3), max_tokens=20)
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "y" * 30}], temperature=0, logit_bias=NO_EOS
        )
        assert r.choices[0].finish_reason == "length" and r.usage.prompt_tokens + r.usage.completion_tokens == 64
        assert client.models.list().data[0].max_model_len == 64
        assert_clean(s)


@pytest.mark.slow
def test_a_request_timeout_ends_the_request_with_what_it_generated(tiny_model_dir, launch) -> None:
    with launch(tiny_model_dir, "--capacity-blocks", "512", "--request-timeout", "0.3") as s:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        t0 = time.monotonic()
        r = client.completions.create(
            model="tiny", prompt="abc", max_tokens=3000, temperature=0, logit_bias=NO_EOS, extra_body={"timeout": 60}
        )
        assert r.choices[0].finish_reason == "length" and 0 < r.usage.completion_tokens < 3000
        # The request asked for 60 s; the server's 0.3 s ends it, so it returns well before the request's own
        # limit would (a bound that only a request running to 60 s fails, however busy the machine).
        assert time.monotonic() - t0 < 50, "the server's limit wins over a longer request timeout"
        assert_clean(s)
