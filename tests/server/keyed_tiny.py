"""A tiny checkpoint's engine and a server on it under two API keys (sk-alice, sk-bob), for the tenant tests: each
key is a cache namespace of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app

KEYS = ["sk-alice", "sk-bob"]


@contextmanager
def tiny_engine(tmp_path_factory: Any, name: str) -> Iterator[Engine]:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp(name) / "tiny")
    engine = Engine(str(directory), capacity_blocks=256, page_size=16, dtype="float64", threads=1)
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def keyed_client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, "tiny", api_keys=KEYS)) as client:
        yield client
