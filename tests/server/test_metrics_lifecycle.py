"""/metrics parses and moves; a client that disconnects frees its blocks; SIGTERM stops the server cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx
import pytest


def test_metrics_parse_and_move(server, client) -> None:
    before = server.metrics()
    client.completions.create(model="tiny", prompt="metrics move " * 4, max_tokens=3, temperature=0)
    client.completions.create(model="tiny", prompt="metrics move " * 4, max_tokens=3, temperature=0)
    after = server.metrics()
    for name in ("queries", "hits"):
        key = f"radixcache_prefix_cache_{name}_tokens_total"
        assert after[key] > before[key]
    assert 0 < after["radixcache_prefix_cache_hit_rate"] <= 1
    assert (
        after["radixcache_time_to_first_token_seconds_count"]
        >= before["radixcache_time_to_first_token_seconds_count"] + 2
    )
    for gauge in ("free", "evictable", "locked"):
        assert f"radixcache_kv_blocks_{gauge}" in after
    assert {"radixcache_requests_running", "radixcache_requests_waiting"} <= set(after)
    assert 1 <= after["radixcache_engine_threads"] <= (os.cpu_count() or 1)  # the thread controller's count now
    assert after["radixcache_engine_thread_changes_total"] >= 0


def _wait_idle(server, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if (
            m["radixcache_requests_running"]
            == m["radixcache_requests_waiting"]
            == 0
            == m["radixcache_kv_blocks_locked"]
        ):
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.1)


def test_a_client_that_disconnects_aborts_its_request(server) -> None:
    body = {"model": "tiny", "prompt": "go on forever", "max_tokens": 3000, "temperature": 0, "stream": True}
    before = server.metrics()
    with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then hang up
    _wait_idle(server)
    body = {"model": "tiny", "prompt": "go on forever, again", "max_tokens": 3000, "temperature": 0}
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(server.v1 + "/completions", json=body, timeout=0.5)
    m = _wait_idle(server)
    assert m["radixcache_requests_cancelled_total"] >= before["radixcache_requests_cancelled_total"] + 2
    assert m["radixcache_generation_tokens_total"] - before["radixcache_generation_tokens_total"] < 3000


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_in_flight_requests_then_exits_cleanly(tiny_model_dir, launch, sig: int) -> None:
    with launch(tiny_model_dir, "--capacity-blocks", "128") as s:
        body = {"model": "tiny", "prompt": "finish me", "max_tokens": 40, "temperature": 0, "stream": True}
        with httpx.stream("POST", s.v1 + "/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            s.proc.send_signal(sig)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert s.proc.wait(timeout=30) == 0
        output = s.proc.stdout.read()
        assert "Traceback" not in output and "error" not in output and "server stopped" in output
