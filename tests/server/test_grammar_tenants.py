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
from radixcache.runtime.server import create_app

SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("grammar_tenants") / "tiny")
    engine = Engine(str(directory), capacity_blocks=256, page_size=16, dtype="float64", threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, "tiny", api_keys=["sk-alice", "sk-bob"])) as c:
        yield c


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
