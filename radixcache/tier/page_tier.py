"""A content-addressed tier of KV pages (the host pool, or the simulator's disk): slots keyed by chained page hash.

Below the device tree, a page needs no tree position: its chained hash (radixcache.page_hash) names its whole
prefix. So a lower tier is a map from hash to slot, LRU over the pages nobody is loading, with locks while a page is
copied back up. Block conservation holds here as in the tree: `free + evictable + locked == capacity`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from radixcache.errors import LockError, RadixCacheError
from radixcache.tier.recency import RecencyOrder


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier. stored: pages written into it. evicted: pages dropped to make room. hit_pages: pages
    found by `count_prefix` (and so offered to a request)."""

    name: str
    capacity: int
    pages: int
    stored: int
    evicted: int
    hit_pages: int


class PageTier:
    """`capacity` slots of pages keyed by page hash, evicting the least recently used unlocked page.

    `on_evict(hash, slot)` runs before an evicted page's slot is reused (the runtime hands the page down a tier
    there). A page is locked while it is copied up (`lock`/`unlock`, counted): a locked page is never evicted.
    """

    def __init__(self, capacity: int, *, name: str = "host", on_evict: Callable[[bytes, int], None] | None = None):
        if type(capacity) is not int or capacity < 1:
            raise RadixCacheError(f"{name} tier: capacity must be a positive int, got {capacity!r}")
        self.name = name
        self.capacity = capacity
        self.on_evict = on_evict
        self._slot: dict[bytes, int] = {}  # every stored page -> its slot
        self._lru = RecencyOrder()  # the unlocked pages, least recently used first
        self._locks: dict[bytes, int] = {}  # locked pages -> lock count (> 0); disjoint from _lru
        # Free slots: `_free` (given back, reused last-in first) and every slot from `_fresh` up (never used, handed
        # out in order): memory grows with the pages stored, not the capacity (a simulated tier may be huge).
        self._free: list[int] = []
        self._fresh = 0
        self._stored = self._evicted = self._hit_pages = 0

    # ------------------------------------------------------------------ queries

    def __contains__(self, page_hash: bytes) -> bool:
        return page_hash in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def count_prefix(self, hashes: Sequence[bytes], start: int = 0) -> int:
        """How many of `hashes[start:]`, from the first, are stored consecutively. Refreshes their recency (`touch`)."""
        slot = self._slot
        n = start
        while n < len(hashes) and hashes[n] in slot:
            n += 1
        self.touch(hashes[start:n])
        self._hit_pages += n - start
        return n - start

    def touch(self, hashes: Sequence[bytes]) -> None:
        """Refresh the recency of the stored, unlocked pages among `hashes` (not a hit), the first last: a run of
        pages is found from its head, so LRU eviction must take its later pages first (a tail without its head is
        never found again)."""
        self._lru.run_to_newest(hashes)

    def slots(self, hashes: Iterable[bytes]) -> list[int]:
        """The slots of stored pages (KeyError for a missing one)."""
        return [self._slot[h] for h in hashes]

    # ------------------------------------------------------------------ changes

    def store(self, page_hash: bytes, older_than: bytes | None = None) -> tuple[int, bool] | None:
        """A slot for `page_hash`: (slot, True) for a new page, whose data the caller must write now; (slot, False)
        when it is already stored (refreshed). None when every slot is locked (the page is not stored), and when
        `older_than` is given and not stored, for a stored page too: the run has a gap there, so neither this page
        nor any after it in the run can be found (a lookup stops at the gap), and a caller storing a run stops.

        The page becomes the most recently used, or with `older_than` (the run's page before it, when a run arrives
        over several commits) just older than that page (if it is locked: the newest, as it will be at its unlock),
        so that a run's head stays its newest page without the run being refreshed at each page added (O(1) a page;
        a run keeps the recency of its last use). A new page is not stored (None) when `older_than` is not stored (a
        run is found from its head: the page would follow a gap), or is the least recently used page of a full
        tier (the new page would be the first to go, and would take its parent's place)."""
        # The order's membership is read off `_slot` and `_locks` (C dict lookups: the LRU holds exactly the stored,
        # unlocked pages), and each change of the order is one call: this runs for every page a tier takes.
        stored, locks = self._slot, self._locks
        slot = stored.get(page_hash)
        anchor = None
        if older_than is not None and older_than != page_hash:
            if older_than not in stored:
                return None  # after a gap (for a stored page too): a lookup stops there, and the caller stops
            if older_than not in locks:
                anchor = older_than
        elif older_than is not None and slot is None:
            return None  # its own parent: not stored, so a gap
        lru = self._lru
        if slot is not None:
            if page_hash not in locks:
                lru.move(page_hash, anchor)
            return slot, False
        if not self._free and self._fresh == self.capacity:
            victim = lru.pop_oldest_unless(anchor)  # not the parent: the new page would go first, in its place
            if victim is None:
                return None
            victim_slot = stored.pop(victim)
            self._evicted += 1
            if self.on_evict is not None:
                self.on_evict(victim, victim_slot)
            self._free.append(victim_slot)
        if self._free:
            slot = self._free.pop()
        else:
            slot, self._fresh = self._fresh, self._fresh + 1
        stored[page_hash] = slot
        lru.insert(page_hash, anchor)
        self._stored += 1
        return slot, True

    def discard(self, page_hash: bytes) -> bool:
        """Drop an unlocked page (its data proved unusable). Returns whether it was stored."""
        if page_hash in self._locks:
            raise LockError(f"{self.name} tier: cannot discard a locked page")
        slot = self._slot.pop(page_hash, None)
        if slot is None:
            return False
        self._lru.remove(page_hash)
        self._free.append(slot)
        return True

    def lock(self, hashes: Sequence[bytes]) -> None:
        """Protect stored pages from eviction (counted). Raises LockError, changing nothing, if one is missing."""
        missing = [h for h in hashes if h not in self._slot]
        if missing:
            raise LockError(f"{self.name} tier: lock of {len(missing)} page(s) that are not stored")
        for h in hashes:
            count = self._locks.get(h, 0)
            if count == 0:
                self._lru.remove(h)
            self._locks[h] = count + 1

    def unlock(self, hashes: Sequence[bytes]) -> None:
        """Undo one `lock` of each page; a page no longer locked is the most recently used (it was just read), the
        first last (`touch`). Raises LockError, changing nothing, if one is not locked."""
        if any(self._locks.get(h, 0) < n for h, n in Counter(hashes).items()):
            raise LockError(f"{self.name} tier: unlock of a page that is not locked (as often)")
        for h in reversed(hashes):
            count = self._locks[h] - 1
            if count:
                self._locks[h] = count
            else:
                del self._locks[h]
                self._lru.insert(h)  # most recently used: it was just read

    # ------------------------------------------------------------------ sizes and checks

    @property
    def free_count(self) -> int:
        return len(self._free) + self.capacity - self._fresh

    @property
    def evictable_count(self) -> int:
        return len(self._lru)

    @property
    def locked_count(self) -> int:
        return len(self._locks)

    @property
    def stats(self) -> TierStats:
        return TierStats(self.name, self.capacity, len(self._slot), self._stored, self._evicted, self._hit_pages)

    def check_invariants(self) -> None:
        """Raise AssertionError unless slots are conserved and every page is either evictable or locked."""
        slots = list(self._slot.values())
        problems = []
        if len(set(slots)) != len(slots):
            problems.append("two pages share a slot")
        if set(slots) & set(self._free) or len(set(self._free)) != len(self._free):
            problems.append("the free list overlaps the stored pages or repeats a slot")
        if any(not 0 <= s < self._fresh for s in slots + self._free):
            problems.append("a slot is out of range")
        if set(self._lru) & set(self._locks) or set(self._lru) | set(self._locks) != set(self._slot):
            problems.append("the evictable and locked pages do not partition the stored pages")
        if any(c < 1 for c in self._locks.values()):
            problems.append("a lock count is below 1")
        if self.free_count + self.evictable_count + self.locked_count != self.capacity:
            problems.append(
                f"free {self.free_count} + evictable {self.evictable_count} + locked {self.locked_count} "
                f"!= capacity {self.capacity}"
            )
        if problems:
            raise AssertionError(f"{self.name} tier: " + "; ".join(problems))
