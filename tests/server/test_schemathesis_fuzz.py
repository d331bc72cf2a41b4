"""Hostile-input fuzzing of the server from its own OpenAPI schema (FastAPI's /openapi.json) with schemathesis:
every operation, with schema-valid (positive) and schema-violating (negative) cases, derandomized (a fixed seed),
while bystander requests run. Checks: no response is a 5xx; every bystander's greedy output equals its output
alone (before the fuzzing); afterwards the cache's invariants hold (/health/cache) and no block is left locked.

This run is stateless: FastAPI's schema declares no OpenAPI links, so a schemathesis state machine would have no
transitions to follow (the test asserts there are none, so that a schema that gains links gets one). The stateful
run is test_schemathesis_stateful.py: a hypothesis state machine that draws these same cases between conversation
turns, abandoned streams and health and metrics scrapes.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("schemathesis")]

BYSTANDERS = ["The cache keeps pages", "One caller cannot fail another", "Tenants share nothing"]
EXAMPLES = {"POST": 150, "GET": 10}  # per operation and generation mode


@pytest.fixture(scope="module")
def fuzzed(tiny_model_dir, launch):
    with launch(
        tiny_model_dir, "--capacity-blocks", "256", "--max-model-len", "192", "--request-timeout", "5"
    ) as server:
        yield server


def _bystander(server, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0}
    r = httpx.post(server.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _run_bystanders(server, stop: threading.Event, seen: list, failures: list) -> None:
    i = 0
    while not stop.is_set():
        prompt = BYSTANDERS[i % len(BYSTANDERS)]
        try:
            seen.append((prompt, _bystander(server, prompt)))
        except Exception as exc:
            failures.append(repr(exc))
        i += 1


def _idle_gauges(server) -> dict:
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(server.url + "/health/cache", timeout=60)
        assert r.status_code == 200, r.text
        gauges = r.json()
        if (gauges["running"] == 0 and gauges["waiting"] == 0) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.1)


def test_schema_fuzzing_gives_no_5xx_and_leaves_bystanders_and_the_cache_intact(fuzzed) -> None:
    alone = {p: _bystander(fuzzed, p) for p in BYSTANDERS}
    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/health/cache"}
    assert not any(op.links for op in operations if hasattr(op, "links")), "the schema has links: run it stateful"

    server_errors: list[str] = []
    calls = {"n": 0}
    stop, seen, failures = threading.Event(), [], []
    thread = threading.Thread(target=_run_bystanders, args=(fuzzed, stop, seen, failures), daemon=True)
    thread.start()
    try:
        for op in operations:
            for mode in schemathesis.GenerationMode:

                @settings(
                    max_examples=EXAMPLES.get(op.method.upper(), 8),
                    derandomize=True,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=op.as_strategy(generation_mode=mode))
                def fuzz(case) -> None:
                    response = case.call(base_url=fuzzed.url, timeout=60)
                    calls["n"] += 1
                    if response.status_code >= 500:
                        server_errors.append(f"{case.method} {case.path} {case.body!r}: {response.text[:300]}")

                try:
                    fuzz()
                except Unsatisfiable:  # an operation without parameters has no schema-violating case
                    assert mode is schemathesis.GenerationMode.NEGATIVE and not op.body and not op.query, op.path
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not server_errors, server_errors[:5]
    assert calls["n"] > 200
    assert not failures, failures[:5]
    assert seen and all(text == alone[p] for p, text in seen), [x for x in seen if x[1] != alone[x[0]]][:3]
    gauges = _idle_gauges(fuzzed)
    assert gauges["invariants"] == "ok" and gauges["locked_blocks"] == 0, gauges
