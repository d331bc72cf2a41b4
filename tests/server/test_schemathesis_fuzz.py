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
from schemathesis.transport.requests import SameHostRedirectsSession  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("schemathesis")]

BYSTANDERS = ["The cache keeps pages", "One caller cannot fail another", "Tenants share nothing"]
# Per operation and generation mode: 60 POST cases (each of the 3 POST operations' positive and negative bodies)
# are 360 schema cases and ~100 GET ones, past the floor of 200 calls below. Most of the test's time is generating
# them (cProfile: ~80%); 150 each took 64.0 s against 29.5 s for 60 here (alone, one after the other, load ~4). The
# stateful run draws the same operations' cases between turns, and test_hostile_requests / test_hostile_schemas send
# the hand-written hostile bodies.
EXAMPLES = {"POST": 60, "GET": 10}
BYSTANDER_TOKENS = 24


@pytest.fixture
def fuzzed(fuzz_server):
    return fuzz_server  # shared with the other schemathesis module (conftest.py)


def _bystander(server, prompt: str, http: httpx.Client | None = None) -> tuple[tuple[str, ...], str]:
    """A greedy bystander's tokens (as the completions API names them: one byte each here) and finish reason;
    `http`: a client whose connection the bystander's requests reuse (default: a new one for this request)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": BYSTANDER_TOKENS, "temperature": 0, "logprobs": 1}
    r = (http or httpx).post(server.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return tuple(choice["logprobs"]["tokens"]), choice["finish_reason"]


def alone_outputs(server) -> dict[str, tuple[tuple[str, ...], str]]:
    """Each bystander's output alone, whole: on a busy machine the first requests (a cold server) can be cut short
    by --request-timeout, so each is asked again until one finishes by itself (at most ten times)."""
    out = {}
    for prompt in BYSTANDERS:
        for _ in range(10):
            tokens, finish = out[prompt] = _bystander(server, prompt)
            if len(tokens) == BYSTANDER_TOKENS or finish == "stop":
                break
        else:
            raise AssertionError(f"the server cut every run of {prompt!r} short: {out[prompt]}")
    return out


def same_as_alone(got: tuple[tuple[str, ...], str], alone: tuple[tuple[str, ...], str]) -> bool:
    """`got` equals the bystander's output alone; or the server's --request-timeout cut it short on a busy machine
    (finish_reason "length" before max_tokens), and its tokens are the first ones of the output alone."""
    tokens, finish = got
    cut = finish == "length" and len(tokens) < BYSTANDER_TOKENS
    return got == alone or (cut and tokens == alone[0][: len(tokens)])


def _run_bystanders(server, stop: threading.Event, seen: list, failures: list) -> None:
    i = 0
    with httpx.Client() as http:  # one keep-alive connection (a new client per request costs an SSL context)
        while not stop.is_set():
            prompt = BYSTANDERS[i % len(BYSTANDERS)]
            try:
                seen.append((prompt, _bystander(server, prompt, http)))
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
    alone = alone_outputs(fuzzed)
    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/health/cache"}
    assert not any(op.links for op in operations if hasattr(op, "links")), "the schema has links: run it stateful"

    server_errors: list[str] = []
    calls = {"n": 0}
    # One session for every case: keep-alive instead of a connection (and a session) per case; the class is the one
    # schemathesis makes per call without it (redirects followed within the host only).
    session = SameHostRedirectsSession()
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
                    response = case.call(base_url=fuzzed.url, session=session, timeout=60)
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
        session.close()
    assert not server_errors, server_errors[:5]
    assert calls["n"] > 200
    assert not failures, failures[:5]
    wrong = [(p, got, alone[p]) for p, got in seen if not same_as_alone(got, alone[p])]
    assert seen and not wrong, wrong[:3]
    gauges = _idle_gauges(fuzzed)
    assert gauges["invariants"] == "ok" and gauges["locked_blocks"] == 0, gauges
