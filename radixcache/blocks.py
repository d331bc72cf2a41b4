"""The block allocator: which of `capacity` block ids are free, held by a caller, or owned by the tree."""

from __future__ import annotations

import operator
from collections.abc import Iterable

from radixcache.errors import BlockStateError

FREE, HELD, IN_TREE = 0, 1, 2
STATE_NAMES = {FREE: "free", HELD: "held by a caller", IN_TREE: "owned by the tree"}


class BlockPool:
    """Tracks the state of every block id and keeps a free list.

    A block is FREE (in the free list), HELD (allocated to a caller and not yet inserted) or IN_TREE (owned
    by a tree node). Ids are conserved: `free + held + in_tree == capacity` always. The free list is a stack,
    so recently freed (cache-warm) blocks are reused first and runs are deterministic.
    """

    __slots__ = ("_free", "capacity", "held", "state")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.state = bytearray(capacity)  # block id -> FREE/HELD/IN_TREE; read-only outside this class
        self._free = list(range(capacity - 1, -1, -1))  # pop() hands out 0, 1, 2, ... first
        self.held = 0

    @property
    def free_count(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        """Move n free blocks to HELD. The caller has checked that n <= free_count."""
        free = self._free
        taken = free[len(free) - n :]
        del free[len(free) - n :]
        taken.reverse()
        state = self.state
        for block in taken:
            state[block] = HELD
        self.held += n
        return taken

    def release(self, blocks: Iterable[int]) -> None:
        """Move HELD or IN_TREE blocks back to FREE. The caller has validated them."""
        state = self.state
        free = self._free
        for block in blocks:
            if state[block] == HELD:
                self.held -= 1
            state[block] = FREE
            free.append(block)

    def adopt(self, blocks: Iterable[int]) -> None:
        """Move HELD blocks into the tree."""
        state = self.state
        n = 0
        for block in blocks:
            state[block] = IN_TREE
            n += 1
        self.held -= n

    def check_held(self, blocks: list[int], what: str) -> None:
        """Raise BlockStateError unless every (already normalised) block is HELD."""
        state = self.state
        for index, block in enumerate(blocks):
            if state[block] != HELD:
                raise BlockStateError(
                    f"{what}: block {block} (index {index}) is {STATE_NAMES[state[block]]}, not held by the caller"
                )

    def normalize(self, blocks: Iterable[int], what: str) -> list[int]:
        """Return `blocks` as a list of distinct Python ints in [0, capacity), or raise BlockStateError."""
        try:
            ids = list(map(operator.index, blocks))
        except TypeError as exc:
            raise BlockStateError(f"{what}: block ids must be ints ({exc})") from None
        if ids and (min(ids) < 0 or max(ids) >= self.capacity):
            bad = next(b for b in ids if not 0 <= b < self.capacity)
            raise BlockStateError(f"{what}: block {bad} is outside [0, {self.capacity})")
        if len(set(ids)) != len(ids):
            seen: set[int] = set()
            dup = next(b for b in ids if b in seen or seen.add(b))  # type: ignore[func-returns-value]
            raise BlockStateError(f"{what}: block {dup} appears more than once")
        return ids

    def free_list(self) -> list[int]:
        return list(self._free)
