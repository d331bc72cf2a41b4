"""A finished request leaves the server's in-flight set and is freed by reference counting at once: its handle
(with its tokens and logits) is not kept by a handle <-> future cycle until the next collection. In-process, over
the tiny random model, with the collector off."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import generation
from radixcache.runtime.testing import tiny_model


def test_a_finished_requests_handle_is_freed_without_a_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    with Engine(tiny_model(seed=3), capacity_blocks=64, threads=1) as engine:
        made: list[weakref.ref[Any]] = []
        real = engine.submit

        def submit(*args: Any, **kwargs: Any) -> Any:
            handle = real(*args, **kwargs)
            made.append(weakref.ref(handle))
            return handle

        monkeypatch.setattr(engine, "submit", submit)
        inflight = generation.Inflight()
        job = generation.Job([list(range(1, 30))], 1, 5, RequestOptions.of(5, caller="test"))
        gc.collect()
        gc.disable()
        try:
            asyncio.run(generation.complete(engine, job, inflight))
            assert engine.wait_idle(30)
            assert made and not inflight.handles
            assert [ref for ref in made if ref() is not None] == []
        finally:
            gc.enable()
