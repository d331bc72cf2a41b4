"""A tiny checkpoint's engine, and an in-process server on it: keyless (`tiny_client`), or under two API keys
(sk-alice, sk-bob) for the tenant tests, each key a cache namespace of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app

KEYS = ["sk-alice", "sk-bob"]


@contextmanager
def tiny_engine(tmp_path_factory: Any, name: str, page_size: int = 16) -> Iterator[Engine]:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp(name) / "tiny")
    engine = Engine(str(directory), capacity_blocks=256, page_size=page_size, dtype="float64", threads=1)
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def keyed_client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, "tiny", api_keys=KEYS)) as client:
        yield client


@contextmanager
def tiny_client(tmp_path_factory: Any, name: str, page_size: int = 16) -> Iterator[TestClient]:
    """A keyless server on a tiny checkpoint's engine of its own, closed afterwards."""
    with tiny_engine(tmp_path_factory, name, page_size) as engine, TestClient(create_app(engine, "tiny")) as client:
        yield client


def module_tiny_server(name: str) -> tuple[Any, Any]:
    """Module-scoped `engine` and `client` fixtures: a keyless server on a tiny checkpoint's engine of the test
    module's own (its cache shared by that module's tests alone; `name`: its folder). At a module's top level:
    `engine_fixture, client_fixture = module_tiny_server("name")`."""

    @pytest.fixture(scope="module", name="engine")
    def engine_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
        with tiny_engine(tmp_path_factory, name) as engine:
            yield engine

    @pytest.fixture(scope="module", name="client")
    def client_fixture(engine: Engine) -> Iterator[TestClient]:
        with TestClient(create_app(engine, "tiny")) as client:
            yield client

    return engine_fixture, client_fixture
