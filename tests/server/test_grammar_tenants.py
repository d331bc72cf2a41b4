"""Structured output under API keys: a compiled grammar is reused within the caller's cache namespace only. Shared,
a request for a schema another tenant had just used skipped the compile (a 400-property schema answered faster
under key B after key A used it, 29 pairs in 30): a timing side channel telling B which schema A sent, the one the
KV cache's namespaces close."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarCompiler
from tests.server.keyed_tiny import keyed_client, tiny_engine

SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with tiny_engine(tmp_path_factory, "grammar_tenants") as engine:
        yield engine


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with keyed_client(engine) as client:
        yield client


def _ask(client: TestClient, key: str, **extra: Any) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "fill the form"}],
        "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "form", "schema": SCHEMA}},
        **extra,
    }
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text


def test_a_schema_another_key_used_is_compiled_afresh(client: TestClient, engine: Engine) -> None:
    compiler: GrammarCompiler = engine._builder.grammars.compiler
    _ask(client, "sk-alice")
    misses, hits = compiler.misses, compiler.hits
    _ask(client, "sk-bob")  # the same schema: bob's own compile, not alice's cached one
    assert (compiler.misses, compiler.hits) == (misses + 1, hits)
    _ask(client, "sk-alice", cache_salt="s")  # a salt is a namespace of its own too
    assert (compiler.misses, compiler.hits) == (misses + 2, hits)
    _ask(client, "sk-bob")  # within a namespace the compile is reused
    _ask(client, "sk-alice")
    assert (compiler.misses, compiler.hits) == (misses + 2, hits + 2)
