"""The logic of the tiers' CUDA-only paths, run on the CPU (radixcache.runtime.kv.tier.copy_sync): which host
memory is pinned, how a side-stream load is ordered against the compute stream, and that host slots a load still
reads stay locked until its copy's event completes. Streams are modelled by their documented ordering rules (work
on one stream runs in order; `wait_stream` orders a stream's later work after the other's work so far; an event
completes when the work recorded before it has), so the expectations do not come from the code under test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from radixcache import RadixCache
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.coordinator import KVTiers
from radixcache.runtime.kv.tier.copy_sync import PendingUnlocks, pins_host_memory, side_stream_copy
from radixcache.runtime.kv.tier.host_pool import HostKVPool
from radixcache.runtime.testing import tiny_config

# ---------------------------------------------------------------------------------------- a model of streams


class Timeline:
    """Operations queued on modelled streams, each with the operations it must run after."""

    def __init__(self) -> None:
        self.after: dict[str, set[str]] = {}
        self.stream_of: dict[str, str] = {}
        self.current: ModelStream | None = None  # the stream new work goes to (None: the default, unmodelled)
        self._ids = itertools.count()

    def node(self, name: str, deps: set[str | None], stream: str) -> str:
        self.after[name] = {d for d in deps if d is not None}
        self.stream_of[name] = stream
        return name

    def runs_before(self, a: str, b: str) -> bool:
        """Whether `a` is guaranteed to have finished when `b` starts."""
        todo, seen = list(self.after[b]), set()
        while todo:
            op = todo.pop()
            if op == a:
                return True
            if op not in seen:
                seen.add(op)
                todo.extend(self.after[op])
        return False

    @contextmanager
    def on(self, stream: ModelStream) -> Iterator[None]:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def queue(self, name: str) -> str:
        """Queue work on the current stream."""
        assert self.current is not None, f"{name} was queued outside any modelled stream"
        return self.current.queue(name)


class ModelStream:
    def __init__(self, timeline: Timeline, name: str) -> None:
        self.timeline, self.name, self.last = timeline, name, None

    def queue(self, op: str) -> str:
        self.last = self.timeline.node(op, {self.last}, self.name)
        return op

    def wait_stream(self, other: ModelStream) -> None:
        mark = f"{self.name} waits for {other.name} #{next(self.timeline._ids)}"
        self.last = self.timeline.node(mark, {self.last, other.last}, self.name)


class ModelEvent:
    def __init__(self) -> None:
        self.point: str | None = None
        self.stream: str | None = None

    def record(self, stream: ModelStream) -> None:
        self.point, self.stream = stream.last, stream.name

    def query(self) -> bool:  # pragma: no cover - not asked in these tests
        raise AssertionError("not modelled")

    def synchronize(self) -> None:  # pragma: no cover
        raise AssertionError("not modelled")


def _load(timeline: Timeline, main: ModelStream, side: ModelStream) -> ModelEvent:
    return side_stream_copy(main, side, lambda: timeline.queue("copy"), on_stream=timeline.on, new_event=ModelEvent)


# ------------------------------------------------------------------------------------------- what is pinned


@pytest.mark.parametrize(("device", "pinned"), [("cuda", True), ("cpu", False), ("mps", False), ("meta", False)])
def test_only_a_cuda_device_gets_pinned_host_pages_and_a_side_stream(device: str, pinned: bool) -> None:
    assert pins_host_memory(device) is pinned


def test_a_cpu_host_pool_is_not_pinned_and_its_load_is_done_when_it_returns() -> None:
    pool = KVPool(tiny_config(), num_blocks=4, page_size=2)
    host = HostKVPool(pool, num_slots=3)
    assert not host.kv.is_pinned()
    pool.kv.normal_()
    host.save(pool, [2, 0], [1, 2])
    pool.kv[:, :, 3].zero_()
    assert host.load(pool, [2], [3]) is None  # no event to wait for: the copy is complete
    assert torch.equal(pool.kv[:, :, 3], pool.kv[:, :, 0])


# ------------------------------------------------------------------------------------------ the side stream


def test_a_side_stream_load_runs_after_earlier_work_and_before_the_prefill_that_reads_it() -> None:
    tl = Timeline()
    main, side = ModelStream(tl, "main"), ModelStream(tl, "side")
    main.queue("decode reading the blocks' old contents")
    _load(tl, main, side)
    main.queue("prefill reading the loaded pages")
    assert tl.stream_of["copy"] == "side"
    assert tl.runs_before("decode reading the blocks' old contents", "copy")
    assert tl.runs_before("copy", "prefill reading the loaded pages")
    assert tl.current is None  # the current stream is given back


def test_the_loads_event_completes_only_after_its_copy() -> None:
    tl = Timeline()
    main, side = ModelStream(tl, "main"), ModelStream(tl, "side")
    event = _load(tl, main, side)
    assert event.stream == "side"
    assert event.point is not None and (event.point == "copy" or tl.runs_before("copy", event.point))


def test_a_second_load_waits_for_work_queued_after_the_first() -> None:
    """Two requests load into blocks in turn; the second load must not overtake the first request's prefill,
    which may still read blocks the second request reuses."""
    tl = Timeline()
    main, side = ModelStream(tl, "main"), ModelStream(tl, "side")
    copies = iter(["copy 1", "copy 2"])
    for _ in range(2):
        side_stream_copy(main, side, lambda: tl.queue(next(copies)), on_stream=tl.on, new_event=ModelEvent)
        main.queue(f"prefill {len(tl.after)}")
    first_prefill = next(op for op in tl.after if op.startswith("prefill"))
    assert tl.runs_before("copy 1", first_prefill)
    assert tl.runs_before(first_prefill, "copy 2")


def test_a_load_that_fails_partway_waits_for_the_copies_it_queued_before_raising() -> None:
    """A copy that raises after queuing some runs: those runs still land, so the recompute on the compute stream
    must follow them, and the caller (which unlocks the host slots at once, having no event) must be able to."""
    tl = Timeline()
    main, side = ModelStream(tl, "main"), ModelStream(tl, "side")
    waited: list[str | None] = []

    class WaitedEvent(ModelEvent):
        def synchronize(self) -> None:
            waited.append(self.point)

    def copy() -> None:
        tl.queue("copy of run 1")
        raise RuntimeError("run 2 failed")

    with pytest.raises(RuntimeError, match="run 2 failed"):
        side_stream_copy(main, side, copy, on_stream=tl.on, new_event=WaitedEvent)
    main.queue("recompute writing the blocks")
    assert tl.runs_before("copy of run 1", "recompute writing the blocks")
    assert waited and all(p == "copy of run 1" or tl.runs_before("copy of run 1", p) for p in waited)
    assert tl.current is None


# ------------------------------------------------------------------------------------- unlocking host slots


class FlagEvent:
    """An event whose completion the test decides; `synchronize` completes it (as waiting for it would)."""

    def __init__(self, done: bool = False) -> None:
        self.done, self.waits = done, 0

    def record(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waits += 1
        self.done = True


def test_pending_unlocks_hands_back_only_finished_copies_in_issue_order() -> None:
    pending = PendingUnlocks()
    a, b, c = FlagEvent(), FlagEvent(), FlagEvent()
    pending.add(a, [b"a"])
    pending.add(b, [b"b"])
    pending.add(c, [b"c"])
    assert pending.finished() == [] and len(pending) == 3
    b.done = c.done = True
    assert pending.finished() == [[b"b"], [b"c"]]
    assert len(pending) == 1 and pending.finished() == []  # each list is handed back once
    a.done = True
    assert pending.finished() == [[b"a"]] and len(pending) == 0


def test_draining_waits_for_every_copy_still_running() -> None:
    pending = PendingUnlocks()
    running, finished = FlagEvent(), FlagEvent(done=True)
    pending.add(running, [b"x", b"y"])
    pending.add(finished, [b"z"])
    assert pending.drain() == [[b"x", b"y"], [b"z"]]
    assert running.waits == 1 and running.done
    assert len(pending) == 0 and pending.drain() == []


def _tiers_with_host_pages(slots: int) -> tuple[KVTiers, list[bytes]]:
    pool = KVPool(tiny_config(), num_blocks=4, page_size=2)
    tiers = KVTiers(RadixCache(4, page_size=2), pool, host_slots=slots)
    assert tiers.host is not None
    hashes = [bytes([i]) * 16 for i in range(slots)]
    for h in hashes:
        assert tiers.host.store(h) is not None
    return tiers, hashes


def test_host_slots_a_copy_reads_stay_locked_until_its_event_completes() -> None:
    tiers, hashes = _tiers_with_host_pages(2)
    host = tiers.host
    assert host is not None
    host.lock(hashes)  # as lock_host does before the blocks are allocated
    event = FlagEvent()
    tiers.unlock_host(hashes, event)
    tiers.poll()
    assert host.locked_count == 2
    assert host.store(b"new page".ljust(16, b"-")) is None  # every slot is still read: nothing may overwrite one
    event.done = True
    tiers.poll()
    assert host.locked_count == 0
    assert host.store(b"new page".ljust(16, b"-")) is not None
    host.check_invariants()


def test_a_load_without_an_event_unlocks_at_once_and_close_waits_for_running_copies() -> None:
    tiers, hashes = _tiers_with_host_pages(3)
    host = tiers.host
    assert host is not None
    host.lock(hashes)
    tiers.unlock_host(hashes[:1])  # the CPU path: the copy is done
    assert host.locked_count == 2
    running = FlagEvent()
    tiers.unlock_host(hashes[1:], running)
    tiers.close()
    assert running.waits == 1 and host.locked_count == 0
    host.check_invariants()


@pytest.mark.parametrize("deferred", [False, True])
def test_a_run_loaded_from_the_host_keeps_its_head_last_to_go_whether_its_unlock_waits_or_not(deferred: bool) -> None:
    """The CUDA path unlocks the host pages a load read once its copy's event completes, after the admission had
    refreshed the run: an unlock makes its pages the newest, so the pages loaded came out newer than the run's head
    (on the device, and in the host too) and a full host tier evicted the head before them. Driven here with an event
    the test completes, as on the CPU path (no event) the same order must come out: the run's tail goes first."""
    p = 2
    tokens = list(range(1, 4 * p + 1))  # 4 pages: 2 on the device and the host, 2 on the host only
    pool = KVPool(tiny_config(), num_blocks=8, page_size=p)
    cache = RadixCache(8, page_size=p)
    tiers = KVTiers(cache, pool, host_slots=4)
    host = tiers.host
    assert host is not None
    chain = tiers.chain(None)
    hashes = chain.upto(tokens, 4)
    for h in reversed(hashes):  # stored as write_through stores a run: its head the newest
        host.store(h)
    cache.insert(tokens[: 2 * p], cache.allocate(2))
    events: list[FlagEvent] = []
    if deferred:
        real_load = tiers.host_pool.load  # type: ignore[union-attr]

        def load(*args: object) -> FlagEvent:
            real_load(*args)
            events.append(FlagEvent())
            return events[-1]

        tiers.host_pool.load = load  # type: ignore[union-attr, method-assign]
    match = tiers.match(tokens, None, chain)
    assert (match.device_pages, match.host_pages) == (2, 2)
    cache.lock(match.device.node)
    held = tiers.lock_host(match, 2)
    assert tiers.load(match, held, 0, tokens, cache.allocate(2)) == (2, None)
    tiers.refresh(chain.deferred(tokens, 4))  # as KVManager.admit does after a load
    assert host.locked_count == (2 if deferred else 0)
    for event in events:
        event.done = True
    tiers.poll()
    assert host.locked_count == 0
    host.store(b"new page".ljust(16, b"-"))  # a full tier: one page of the run goes
    assert [h in host for h in hashes] == [True, True, True, False]
    host.check_invariants()


def test_host_pages_a_prefetch_held_keep_the_runs_head_last_to_go_under_a_deferred_disk_load(tmp_path) -> None:
    """The host pages a prefetch holds (the disk run chains on them) stayed locked until its disk pages were copied:
    under a load deferred layer by layer, after the admission's refresh, so their unlock made them newer than the
    run's head and a full host tier evicted the head before them. They are let go once the host copy is done."""
    from radixcache.runtime.kv.tier.disk_store import DiskStore

    p = 2
    tokens = list(range(1, 6 * p + 1))  # pages 0-1 on the device and the host, 2-3 on the host, 4-5 on disk
    pool = KVPool(tiny_config(), num_blocks=16, page_size=p)
    cache = RadixCache(16, page_size=p)
    disk = DiskStore(tmp_path, max_bytes=1 << 24, fingerprint="fp")
    tiers = KVTiers(cache, pool, host_slots=4, disk=disk, fingerprint="fp")
    host = tiers.host
    assert host is not None and tiers.reader is not None
    try:
        chain = tiers.chain(None)
        hashes = chain.upto(tokens, 6)
        scratch = cache.allocate(2)
        tiers._write_disk(hashes[4:], scratch, tokens[4 * p :], None)  # a run of its own on disk
        assert disk.flush(30) and disk.count_prefix(hashes[4:]) == 2
        cache.free(scratch)
        for h in reversed(hashes[:4]):
            host.store(h)
        cache.insert(tokens[: 2 * p], cache.allocate(2))
        tiers.prefetch(1, tokens, None, chain)  # holds host pages 2-3
        while not tiers.prefetch(1, tokens, None, chain):
            tiers.wait_prefetch(1.0)
        match = tiers.match(tokens, None, chain)
        assert (match.device_pages, match.host_pages, match.lower_pages) == (2, 2, 2)
        cache.lock(match.device.node)
        held = tiers.lock_host(match, 2)
        loaded, layered = tiers.load(match, held, 2, tokens, cache.allocate(4), rid=1, defer=True)
        assert loaded == 4 and layered is not None
        tiers.refresh(chain.deferred(tokens, 6))  # as KVManager.admit does after a load
        layered.copy_until(None)
        assert host.locked_count == 0
        host.store(b"new page".ljust(16, b"-"))  # a full tier: one page of the run goes, its tail
        assert [h in host for h in hashes[:4]] == [True, True, True, False]
        host.check_invariants()
    finally:
        tiers.close()
