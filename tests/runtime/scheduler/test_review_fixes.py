"""Defects found in review of the first wave, each pinned by a test that failed before its fix: an unhashable
namespace, a stream that waited forever, pins wider than asked and silently dropped, a root kept per namespace
ever seen, and fork's BOS in the middle of a branch."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from radixcache import TreeNode
from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import RequestTooLargeError
from radixcache.runtime.testing import CharTokenizer, RandomModel

from .conftest import assert_clean, ids


def test_an_unhashable_namespace_is_refused_before_it_is_queued(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    others = engine.submit([ids(10, 1), ids(10, 2)], 20, ignore_eos=True)
    with pytest.raises(ValueError, match="namespace must be hashable, got list"):
        engine.generate(ids(10, 3), 2, namespace=["tenant"])
    with pytest.raises(ValueError, match="namespace must be hashable"):
        engine.unpin(namespace={"a": 1})
    assert [len(h.result(60).token_ids) for h in others] == [20, 20], "requests in flight are untouched"
    assert engine.wait_idle(30)
    assert_clean(engine)


def test_a_stream_raises_when_its_request_is_refused(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=4, page_size=4)  # 16 tokens in all

    async def consume() -> list[str]:
        return [delta async for delta in engine.stream(ids(40, 4), 4)]

    with pytest.raises(RequestTooLargeError, match="whole KV pool holds 4 pages"):
        asyncio.run(asyncio.wait_for(consume(), 30))
    assert engine.wait_idle(30)
    assert_clean(engine)


def test_a_stream_raises_when_the_loop_thread_dies(tiny: RandomModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))  # the expected death

    def broken_drain() -> list:  # outside the step's own error handling: the loop thread itself breaks
        raise RuntimeError("the loop thread dies")

    monkeypatch.setattr(engine.scheduler, "drain", broken_drain)

    async def consume() -> list[str]:
        return [delta async for delta in engine.stream(ids(10, 5), 4)]

    with pytest.raises(RuntimeError, match="loop thread dies"):
        asyncio.run(asyncio.wait_for(consume(), 30))
    for thread in threading.enumerate():  # let it finish dying within this test
        if thread.name == "radixcache-engine":
            thread.join(30)
    assert [str(e) for e in died] == ["the loop thread dies"]


def test_a_pin_locks_exactly_the_pages_asked_for(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_pinned_fraction=0.5)
    prompt = ids(64, 6)
    r = engine.generate(prompt, 1, pin=4)
    assert r.pinned_tokens == 4
    assert engine.stats.pinned_blocks == 1 and engine.cache.locked_blocks == 1, "one page, not the 64-token node"
    engine.cache.evict(engine.cache.evictable_blocks)
    assert engine.cache.peek(prompt).length == 4, "the pinned page survives eviction, the rest does not"
    assert engine.unpin(prompt) == 1
    assert_clean(engine)


def test_a_pin_past_the_pinned_share_is_refused_and_the_caller_is_told(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=32, page_size=4, max_pinned_fraction=0.25)  # 8 pinned pages at most
    first = engine.generate(ids(24, 7), 1, pin=True)  # 6 pages
    second = engine.generate(ids(24, 8), 1, pin=True)  # 6 more would make 12
    shared = engine.generate([*ids(24, 7)[:8], 5, 5], 1, pin=8)  # pages already pinned by the first: free
    assert (first.pinned_tokens, second.pinned_tokens, shared.pinned_tokens) == (24, 0, 8)
    assert engine.stats.pinned_blocks == 6
    assert engine.unpin() == 2
    assert_clean(engine)


def test_an_emptied_namespace_keeps_nothing(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=1024, page_size=4)
    tag = f"emptied-{id(engine)}-"  # this test's roots alone: other tests' engines may live in this process
    handles = [engine.submit(ids(9, 100 + i), 1, namespace=f"{tag}{i}") for i in range(300)]  # run in batches
    for h in handles:
        h.result(60)
    assert len(engine.cache.namespaces()) == 300
    engine.cache.evict(engine.cache.evictable_blocks)
    assert engine.cache.namespaces() == []
    gc.collect()
    roots = [
        o for o in gc.get_objects() if type(o) is TreeNode and o.parent is None and str(o.namespace).startswith(tag)
    ]
    assert len(roots) < 10, f"{len(roots)} of its 300 namespace roots are still alive"
    assert_clean(engine)


class BosTokenizer(CharTokenizer):
    """A toy tokenizer that prepends a BOS id, as Llama's do, unless told not to."""

    bos_token_id = 96

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([self.bos_token_id] if add_special_tokens else []) + super().encode(text)


def test_fork_continuations_carry_no_second_bos(tiny: RandomModel) -> None:
    engine = Engine(RandomModel(tiny.config, tiny.weights), tokenizer=BosTokenizer(tiny.config.vocab_size))
    prefix = "a shared prefix of a few pages: "
    outs = engine.fork(prefix, continuations=["first", "second"], max_new_tokens=2)
    want = [len(prefix) + 1 + len(c) for c in ("first", "second")]  # one BOS, at the start
    assert [o.prompt_tokens for o in outs] == want
    assert engine.wait_idle(30)
    assert_clean(engine)
