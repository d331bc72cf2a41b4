"""A dropped engine is freed by reference counting alone, the moment its last user lets go: its KV pool, its tiers'
pools and its model's derived weights do not wait for a full collection of the garbage collector.

Its parts called back into each other strongly (a request handle and its future, the loop and the heap timer, the
tiers and their TieredCache, a model and its native layer plan), so every dropped engine became cyclic garbage that,
having lived a while, only a full collection frees, which can come long after. A test worker that built engines one
after another grew to 10 GB and the machine ran out of memory mid-run. Each test here runs with the collector off:
what it drops must be freed without it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import random_block_weight, random_weights, tiny_config, tiny_model


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()  # what earlier tests left is not counted here
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _parts(engine: Engine) -> dict[str, weakref.ref[Any]]:
    parts = {"engine": engine, "pool": engine.pool, "model": engine.model, "scheduler": engine.scheduler}
    parts["loop"] = engine._loop
    parts["tree"] = engine.cache
    if engine.tiers is not None:
        parts["tiers"] = engine.tiers
        parts["tiered cache"] = engine.tiers.tiered
        if engine.tiers.host_pool is not None:
            parts["host pool"] = engine.tiers.host_pool
    return {name: weakref.ref(part) for name, part in parts.items()}


def _alive(refs: dict[str, weakref.ref[Any]]) -> list[str]:
    return [name for name, ref in refs.items() if ref() is not None]


def _use(engine: Engine) -> None:
    """Requests as callers make them: a whole one, one cancelled through its handle, one through its future (an
    asyncio waiter's cancel), a session's turns."""
    assert engine.generate([1, 2, 3, 4, 5], max_new_tokens=4, ignore_eos=True).finish_reason == "length"
    handle = engine.submit([6, 7, 8, 9], 50, ignore_eos=True)
    handle.cancel()
    handle.result(30)
    other = engine.submit([6, 7, 8, 9, 10], 50, ignore_eos=True)
    other.future.cancel()
    assert engine.wait_idle(30)

    async def waited() -> None:
        await asyncio.wrap_future(engine.submit([3, 4, 5], 3, ignore_eos=True).future)

    asyncio.run(waited())


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "dropped without close"])
def test_a_used_engine_is_freed_when_dropped(no_collector: None, closed: bool) -> None:
    engine = Engine(tiny_model(), capacity_blocks=64, page_size=4, threads=1)
    _use(engine)
    refs = _parts(engine)
    if closed:
        assert engine.close()
    else:
        assert engine.wait_idle(30)  # the loop thread leaves once there is no work
    del engine
    assert not _alive(refs)


def test_an_engine_with_host_and_disk_tiers_is_freed_with_its_pools(no_collector: None, tmp_path: Path) -> None:
    engine = Engine(
        tiny_model(),
        capacity_blocks=8,
        page_size=4,
        threads=1,
        host_kv_memory=64 * 1024,
        cache_dir=tmp_path / "kv",
        write_policy="write_back",
    )
    for start in range(4):  # more than the device holds: pages go down to the host and the disk
        engine.generate(list(range(start * 20 + 1, start * 20 + 17)), max_new_tokens=2, ignore_eos=True)
    assert engine.flush(30)
    refs = _parts(engine)
    assert {"tiers", "host pool"} <= set(refs)
    assert engine.close()
    del engine
    assert not _alive(refs)


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler")
def test_a_gguf_model_with_its_native_layer_plan_is_freed(no_collector: None) -> None:
    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
    weights = random_weights(cfg, 5)
    blocks = {}
    for i, (name, w) in enumerate(sorted(weights.items())):
        if w.dim() == 2 and name != "model.embed_tokens.weight":
            blocks[name] = random_block_weight("Q4_1", *w.shape, seed=i)
            weights[name] = blocks[name].dequantize()
    engine = Engine(LlamaModel(cfg, weights, quant="gguf", blocks=blocks), capacity_blocks=32, page_size=8, threads=1)
    del weights, blocks
    assert engine.model.native_layers is not None  # the plan that held the model back
    engine.generate([[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=4, ignore_eos=True)
    refs = _parts(engine)
    assert engine.close()
    del engine
    assert not _alive(refs)
