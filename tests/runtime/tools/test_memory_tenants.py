"""`ToolCallMemory` per cache namespace: a scoped handle finds its own namespace's calls only, and the bounds are
shared fairly: the namespace holding the most loses its oldest entry, so one tenant's tool traffic cannot evict the
calls of a tenant holding less (one LRU for all let a busy tenant push out every other tenant's calls, whose next
turns then re-rendered them and missed the cache)."""

from __future__ import annotations

import random
import tracemalloc

from radixcache.runtime.tools import ToolCallMemory
from radixcache.runtime.tools.messages import ToolCall


def _calls(prefix: str, n: int) -> list[tuple[ToolCall, ...]]:
    return [(ToolCall(f"call_{prefix}{i}", "f", "{}"),) for i in range(n)]


def test_a_namespace_finds_its_own_calls_and_unscoped_ones() -> None:
    memory = ToolCallMemory()
    alice, bob = memory.scoped("a"), memory.scoped("b")
    ((mine,),), ((shared,),) = _calls("a", 1), _calls("u", 1)
    alice.remember([mine], "alice wrote")
    memory.remember([shared], "unscoped")  # a plain handle (the cluster front's) is seen by every namespace
    assert alice.lookup([mine]) == "alice wrote" and bob.lookup([mine]) is None
    assert memory.scoped(None).lookup([mine]) is None  # the keyless namespace is a namespace too
    assert memory.lookup([mine]) == "alice wrote"  # the unscoped handle finds any (it holds the secret ids)
    assert alice.lookup([shared]) == bob.lookup([shared]) == "unscoped"
    bob.remember([mine], "bob wrote")  # the same ids again (the ids are random: never in practice) move to bob
    assert alice.lookup([mine]) is None and bob.lookup([mine]) == "bob wrote" and len(memory) == 2


def test_a_busy_namespace_evicts_its_own_calls_not_a_quiet_ones() -> None:
    memory = ToolCallMemory(max_entries=10)
    quiet, busy = _calls("q", 3), _calls("b", 100)
    for c in quiet:
        memory.scoped("quiet").remember(c, "q")
    for c in busy:
        memory.scoped("busy").remember(c, "b")
        assert len(memory) <= 10
    assert all(memory.scoped("quiet").lookup(c) == "q" for c in quiet)
    kept = [c for c in busy if memory.scoped("busy").lookup(c) is not None]
    assert kept == busy[-7:]  # least recently used first, within its own namespace
    # two busy namespaces share the bound evenly: each keeps half, the quiet one keeps its calls
    for c in _calls("o", 50):
        memory.scoped("other").remember(c, "o")
    held = {
        ns: sum(memory.scoped(ns).lookup(c) is not None for c in cs)
        for ns, cs in [("busy", busy), ("other", _calls("o", 50)), ("quiet", quiet)]
    }
    assert held == {"busy": 4, "other": 3, "quiet": 3} or held == {"busy": 3, "other": 4, "quiet": 3}


def test_the_bytes_bound_is_shared_the_same_way() -> None:
    memory = ToolCallMemory(max_entries=1000, max_bytes=80_000)
    small = _calls("s", 1)[0]
    memory.scoped("small").remember(small, "x" * 5_000)
    for c in _calls("big", 30):
        memory.scoped("big").remember(c, "y" * 9_000)  # at most an eighth of the bytes each: kept
        assert memory.bytes <= 80_000 and memory.scoped("big").lookup(c) == "y" * 9_000
    assert memory.scoped("small").lookup(small) == "x" * 5_000


def test_the_bytes_bound_bounds_the_memory_the_entries_take() -> None:
    """Each id was an int object (28 bytes) besides its tuple slot (8), which the byte estimate left out: past 256
    they are objects of their own, so remembered long replies took 3.6 times the bound (64 MiB: 234 MiB). The ids
    are kept as 8-byte integers, what the estimate counts."""
    rng = random.Random(0)
    first, kept = [ToolCall("call_0", "f", '{"x": 1}')], None
    tracemalloc.start()
    try:
        memory = ToolCallMemory()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(100):
            ids = [rng.randrange(300, 49152) for _ in range(2000)]  # as the engine's output: an int object each
            raw = "".join(rng.choice("abcdefgh ") for _ in range(4000))
            memory.remember(first if i == 0 else [ToolCall(f"call_{i}", "f", '{"x": 1}')], raw, ids, content="")
            kept = kept or (raw, tuple(ids))
            del ids
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert taken <= 1.3 * memory.bytes, (taken, memory.bytes)
    assert memory.lookup_emitted(first, "") == kept  # the text and ids as remembered, ids a tuple of ints


def test_an_entry_heavier_than_an_eighth_of_the_bytes_is_not_kept_and_flushes_no_one() -> None:
    # kept, the newest entry always stays: one reply the size of a context pushed out every other tenant's calls
    memory = ToolCallMemory(max_entries=100, max_bytes=8000)
    ((quiet,),), ((huge,),), ((fits,),) = _calls("q", 1), _calls("h", 1), _calls("f", 1)
    memory.scoped("quiet").remember([quiet], "q")
    memory.scoped("busy").remember([huge], "x" * 7000)  # about 7,200 bytes of the 8,000: more than an eighth
    assert memory.scoped("busy").lookup([huge]) is None and memory.bytes < 1000
    memory.scoped("busy").remember([fits], "x" * 700)  # about 900 bytes: at most an eighth, kept
    assert memory.scoped("busy").lookup([fits]) == "x" * 700
    assert memory.scoped("quiet").lookup([quiet]) == "q" and len(memory) == 2
