"""The shared bounded caches (compiled grammars, the tool-call memory, the legacy call ids) are shared fairly by
tenants, not by cache namespaces. Each `cache_salt` is a namespace of its own, and the fair share was a namespace's:
a key sending a new salt per request held a share per salt, and past the bound every other tenant (holding no more
than one) lost its grammars and remembered calls, whose next requests compiled again (a recompile the flooder could
time) and rendered replayed calls from nobody's memory. A key's salts are one tenant, all keyless callers another."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.page_hash import namespace_key
from radixcache.runtime import Engine
from radixcache.runtime.server.generation import namespace_for
from radixcache.runtime.server.legacy import LegacyCalls
from radixcache.runtime.tools import ToolCall, ToolCallMemory
from radixcache.runtime.tools.fair_lru import fair_scope
from tests.server.keyed_tiny import keyed_client, tiny_engine
from tests.tiny_tools import TOOLS

BOUND = 4
ASK = {"role": "user", "content": "Add one and two."}
ADD = {"type": "function", "function": {"name": "add"}}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with tiny_engine(tmp_path_factory, "salted_fairness") as engine:
        engine._builder.grammars.max_entries = BOUND  # read when the compiler is built, on the first grammar
        engine.tool_memory._store = ToolCallMemory(max_entries=BOUND)._store  # the engine's one memory, shrunk
        yield engine


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with keyed_client(engine) as client:
        yield client


def _chat(client: TestClient, key: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [ASK], "temperature": 0, "max_tokens": 200, **extra}
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def _calls(reply: dict[str, Any]) -> list[ToolCall]:
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "tool_calls", choice
    return [
        ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]
    ]


def test_a_key_salting_every_request_evicts_no_other_tenants_grammars_or_calls(
    client: TestClient, engine: Engine
) -> None:
    form = {"type": "json_schema", "json_schema": {"name": "form", "schema": SCHEMA}}
    _chat(client, "sk-alice", response_format=form, max_tokens=2)
    calls = _calls(_chat(client, "sk-alice", tools=TOOLS, tool_choice=ADD))  # alice: 2 grammars, 1 call
    for i in range(3 * BOUND):  # bob: a grammar and a call under each of a dozen salts
        _calls(_chat(client, "sk-bob", tools=TOOLS, tool_choice=ADD, cache_salt=f"salt-{i}"))
    compiler = engine._builder.grammars.compiler
    assert len(compiler) == BOUND and len(engine.tool_memory) == BOUND
    assert engine.tool_memory.scoped(namespace_for("sk-alice")).lookup(calls) is not None
    hits, misses = compiler.hits, compiler.misses
    _chat(client, "sk-alice", response_format=form, max_tokens=2)
    _chat(client, "sk-alice", tools=TOOLS, tool_choice=ADD, max_tokens=2)
    assert (compiler.hits, compiler.misses) == (hits + 2, misses)  # both of alice's grammars were still kept


def test_a_salted_flood_of_legacy_calls_keeps_another_tenants_ids() -> None:
    calls = LegacyCalls(size=4)
    alice = namespace_for("sk-alice")
    calls.remember([ToolCall("call_alice", "add", '{"a": 1}')], "ctx", scope=alice)
    for i in range(10):
        calls.remember(
            [ToolCall(f"call_b{i}", "add", f'{{"a": {i + 2}}}')], "ctx", scope=namespace_for("sk-bob", f"s{i}")
        )
    assert calls.id_for("add", '{"a": 1}', "ctx", scope=alice) == "call_alice"


def test_a_keys_salts_are_one_tenant_and_keyless_callers_another() -> None:
    assert {fair_scope(namespace_for("sk-bob", s)) for s in (None, "a", "b")} == {fair_scope(namespace_for("sk-bob"))}
    assert {fair_scope(namespace_for(None, s)) for s in (None, "a", "b")} == {None}
    assert fair_scope(namespace_for("sk-alice")) != fair_scope(namespace_for("sk-bob"))
    assert fair_scope(namespace_for("sk-alice", "a")) != fair_scope(namespace_for("sk-bob", "a"))


def test_namespaces_keep_their_page_keys() -> None:
    """The namespace's value is unchanged, so are the page hashes of a disk cache written before."""
    for key, salt in (("sk-alice", None), ("sk-alice", "s"), (None, "s")):
        digest = hashlib.sha256()
        for part in (key, salt):
            digest.update(b"\x00" if part is None else b"\x01" + part.encode() + b"\x00")
        expected = "ns:" + digest.hexdigest()[:32]
        assert namespace_for(key, salt) == expected and namespace_key(namespace_for(key, salt)) == namespace_key(
            expected
        )
