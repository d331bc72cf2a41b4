"""Stateful hostile-input fuzzing of the server through its HTTP API: a hypothesis state machine interleaves
conversations that grow turn by turn (with session ids and cache salts), streams cut off after a few events (a
client that goes away: the server cancels), schemathesis cases drawn from the server's own OpenAPI schema (schema-
valid and schema-violating bodies for every operation), and /health, /health/cache, /metrics and /v1/models, while
greedy bystander requests run. Checks after every step: no response was a 5xx; and at the end: every bystander's
output equals its output alone, the cache's invariants hold, no block is left locked, and /metrics counts no 5xx.

Why a hypothesis state machine rather than schemathesis' own: FastAPI's schema declares no OpenAPI links, so
schemathesis' state machine has no transitions (test_schemathesis_fuzz.py asserts there are none); the states that
matter here (a conversation's history, a stream in flight) live in the client, and the machine keeps them.
Derandomized and bounded: 10 runs of 15 steps, a request timeout of 2 s (about 20-30 s on the tiny checkpoint on 2
busy cores).
"""

from __future__ import annotations

import threading

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule  # noqa: E402
from schemathesis.transport.requests import SameHostRedirectsSession  # noqa: E402

from tests.server.test_schemathesis_fuzz import (  # noqa: E402
    _idle_gauges,
    _run_bystanders,
    alone_outputs,
    same_as_alone,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("schemathesis")]

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
SALTS = st.sampled_from([None, "tenant-a", "tenant-b"])


@pytest.fixture
def fuzzed(fuzz_server):
    return fuzz_server  # shared with the other schemathesis module (conftest.py)


def _machine(server, operations: list, server_errors: list[str], calls: list[str]) -> type[RuleBasedStateMachine]:
    client = httpx.Client(base_url=server.url, timeout=60)
    session = SameHostRedirectsSession()  # the schema cases' keep-alive session (schemathesis makes one per call)

    def check(response: httpx.Response, what: str) -> httpx.Response:
        calls.append(what.split(":")[0][:40])
        if response.status_code >= 500:
            server_errors.append(f"{what}: {response.status_code} {response.text[:300]}")
        return response

    class ServerMachine(RuleBasedStateMachine):
        conversations = Bundle("conversations")

        @initialize()
        def models(self) -> None:
            assert check(client.get("/v1/models"), "models").status_code == 200

        @rule(target=conversations, salt=SALTS, system=TEXT, first=TEXT, session=st.integers(0, 3))
        def start_conversation(self, salt, system: str, first: str, session: int) -> dict:
            conversation = {"salt": salt, "session": f"s{session}", "messages": [{"role": "system", "content": system}]}
            self._turn(conversation, first)
            return conversation

        @rule(conversation=conversations, text=TEXT)
        def next_turn(self, conversation: dict, text: str) -> None:
            self._turn(conversation, text)

        def _turn(self, conversation: dict, text: str) -> None:
            conversation["messages"].append({"role": "user", "content": text})
            body = {"model": "tiny", "messages": conversation["messages"], "max_tokens": 4, "temperature": 0}
            if conversation["salt"] is not None:
                body["cache_salt"] = conversation["salt"]
            headers = {"x-session-id": conversation["session"]}
            r = check(client.post("/v1/chat/completions", json=body, headers=headers), "conversation turn")
            if r.status_code == 200:
                reply = r.json()["choices"][0]["message"]["content"]
                conversation["messages"].append({"role": "assistant", "content": reply})
            else:  # the history outgrew --max-model-len: a 400 naming it; the conversation starts over
                assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
                del conversation["messages"][1:]

        @rule(events=st.integers(0, 3), chat=st.booleans(), max_tokens=st.integers(1, 64))
        def stream_then_hang_up(self, events: int, chat: bool, max_tokens: int) -> None:
            """A stream the client abandons after `events` events: the server cancels the request."""
            body = {"model": "tiny", "max_tokens": max_tokens, "stream": True, "temperature": 0.8}
            if chat:
                body["messages"] = [{"role": "user", "content": "go on"}]
            else:
                body["prompt"] = "A stream that is cut off"
            path = "/v1/chat/completions" if chat else "/v1/completions"
            with client.stream("POST", path, json=body) as r:
                check(r, "stream")
                for i, _line in enumerate(r.iter_lines()):
                    if i >= events:
                        break

        @rule(data=st.data(), which=st.integers(0, 10**6), negative=st.booleans())
        def schema_case(self, data, which: int, negative: bool) -> None:
            op = operations[which % len(operations)]
            mode = schemathesis.GenerationMode.NEGATIVE if negative else schemathesis.GenerationMode.POSITIVE
            if negative and not (op.body or op.query):
                mode = schemathesis.GenerationMode.POSITIVE  # nothing to violate
            case = data.draw(op.as_strategy(generation_mode=mode))
            response = case.call(base_url=server.url, session=session, timeout=60)
            check(response, f"{case.method} {case.path} {case.body!r}"[:400])

        @rule()
        def health(self) -> None:
            assert check(client.get("/health"), "health").status_code == 200
            r = check(client.get("/health/cache"), "health/cache")
            assert r.status_code == 200 and r.json()["invariants"] == "ok", r.text

        @rule()
        def metrics(self) -> None:
            assert check(client.get("/metrics"), "metrics").status_code == 200

        @invariant()
        def no_5xx(self) -> None:
            assert not server_errors, server_errors[:3]

    return ServerMachine


def _server_errors_counted(server) -> dict[str, float]:
    """/metrics' 5xx counters (radixcache_http_errors_total, status 5xx), by their labels: this run's are the growth."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    rows = [line.rsplit(" ", 1) for line in text.splitlines()]
    return {row[0]: float(row[1]) for row in rows if row[0].startswith('radixcache_http_errors_total{status="5')}


def test_stateful_fuzzing_gives_no_5xx_and_leaves_bystanders_and_the_cache_intact(fuzzed) -> None:
    before = _server_errors_counted(fuzzed)  # the shared server's (conftest.py's fuzz_server) before this run
    alone = alone_outputs(fuzzed)
    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    server_errors: list[str] = []
    calls: list[str] = []
    machine = _machine(fuzzed, operations, server_errors, calls)
    stop, seen, failures = threading.Event(), [], []
    thread = threading.Thread(target=_run_bystanders, args=(fuzzed, stop, seen, failures), daemon=True)
    thread.start()
    try:
        machine.TestCase.settings = settings(
            max_examples=10,
            stateful_step_count=15,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        machine.TestCase().runTest()
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not server_errors, server_errors[:5]
    assert not failures, failures[:5]
    wrong = [(p, got, alone[p]) for p, got in seen if not same_as_alone(got, alone[p])]
    assert seen and not wrong, wrong[:3]
    gauges = _idle_gauges(fuzzed)
    assert gauges["invariants"] == "ok" and gauges["locked_blocks"] == 0, gauges
    after = _server_errors_counted(fuzzed)
    assert not [(k, n) for k, n in after.items() if n > before.get(k, 0.0)], (before, after)
    kinds = {what.split(" ")[0] for what in calls}
    assert len(calls) >= 80 and {"conversation", "stream", "health", "metrics", "POST"} <= kinds, sorted(kinds)
