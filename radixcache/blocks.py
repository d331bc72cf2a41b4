"""The block allocator: which of `capacity` block ids are free, held by a caller, or owned by the tree."""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Sequence

from radixcache.errors import BlockStateError
from radixcache.tokens import LOW_BYTE, first_bool

FREE, HELD, IN_TREE = 0, 1, 2
STATE_NAMES = {FREE: "free", HELD: "held by a caller", IN_TREE: "owned by the tree"}

# Block ids travel as int64 arrays (array('q')): node.blocks, MatchResult.blocks, allocate's result and the
# free list. Copying, slicing, concatenating and comparing them is then memcpy/memcmp, not a pass over Python
# ints (at page size 1 a chat turn has over a thousand), and an array holds ints by construction.
BLOCK_TYPECODE = "q"


def block_ids(ids: Iterable[int] = ()) -> array:
    """A new int64 block-id array (BLOCK_TYPECODE) holding `ids`."""
    return array(BLOCK_TYPECODE, ids)


def as_block_ids(blocks: Iterable[int]) -> array | None:
    """`blocks` itself if it is already a block-id array, a converted copy of a list, tuple or other array, or
    None: when an id is not an int in int64 range, or for any other type (the caller then takes its exact path,
    which validates one id at a time and names what is wrong)."""
    kind = type(blocks)
    if kind is array:
        if blocks.typecode == BLOCK_TYPECODE:  # type: ignore[attr-defined]
            return blocks  # type: ignore[return-value]
    elif kind is not list and kind is not tuple:  # e.g. bytes, which array() would read as raw int64s
        return None
    try:
        ids = array(BLOCK_TYPECODE, blocks)  # ints and objects with __index__, as operator.index takes
    except (TypeError, OverflowError, ValueError):
        return None
    return None if kind is not array and bool_at(blocks, ids) is not None else ids  # type: ignore[arg-type]


def bool_at(blocks: Sequence[object], ids: array) -> int | None:
    """The index of the first bool in `blocks` (a list or tuple), given `ids`, their block-id array; else None.
    True is an int to Python (array() and operator.index take it as block 1), never a block id."""
    return first_bool(blocks, ids.tobytes()[LOW_BYTE::8])


class BlockPool:
    """Tracks the state of every block id and keeps a free list.

    A block is FREE (in the free list), HELD (allocated to a caller and not yet inserted) or IN_TREE (owned
    by a tree node). Ids are conserved: `free + held + in_tree == capacity` always. The free list is a stack,
    so recently freed (cache-warm) blocks are reused first and runs are deterministic.

    Every list of ids here is a block-id array (`block_ids`).
    No call on the hot path writes a per-block state, so a request's cost does not grow with a Python loop
    over its blocks (at page size 1 a chat turn has thousands):
    - IN_TREE is implicit: a block that is neither free nor held. Giving tree blocks back is an array extend.
    - HELD blocks live in *leases*: each `take` records a private copy of the ids it hands out, keyed by the
      first id. A run of ids that is a lease, or a lease's prefix, is proven held (and distinct, and in range)
      by one C-speed list comparison, and adopting it consumes the lease (the rest stays leased).
    - What no lease proves falls back to the exact path: `_loosen` moves every lease into the `_loose` set,
      and each block is checked one by one, as before.
    `state` builds the per-block view on demand, for checks and error messages.
    """

    __slots__ = ("_free", "_fresh", "_leases", "_loose", "capacity", "held")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # The free stack is `range(capacity - 1, _fresh - 1, -1)` (ids never handed out, implicit) under `_free`:
        # pop() hands out 0, 1, 2, ... first, and memory grows with the blocks used, not with the capacity (a
        # simulated cache may be far larger than its trace).
        self._fresh = 0
        self._free = block_ids()
        self._leases: dict[int, array] = {}  # first id -> held ids handed out together (a private copy)
        self._loose: set[int] = set()  # held ids outside any lease; disjoint from the leases
        self.held = 0

    @property
    def free_count(self) -> int:
        return len(self._free) + self.capacity - self._fresh

    @property
    def fresh(self) -> int:
        """How many ids were ever handed out: 0 .. fresh - 1. Every id from `fresh` to `capacity` is FREE."""
        return self._fresh

    @property
    def state(self) -> bytearray:
        """Block id -> FREE/HELD/IN_TREE for the ids ever handed out (0 .. fresh - 1; the rest are FREE), built now
        in O(fresh), not O(capacity), which may be far past memory (2**70): for checks and messages."""
        state = bytearray([IN_TREE]) * self._fresh
        for block in self._free:
            state[block] = FREE
        for block in self._loose:
            state[block] = HELD
        for lease in self._leases.values():
            for block in lease:
                state[block] = HELD
        return state

    def state_of(self, block: int) -> int:
        """The state of one (in-range) block, in O(held + free): for error messages."""
        if block in self._loose or any(block in lease for lease in self._leases.values()):
            return HELD
        return FREE if block >= self._fresh or block in self._free else IN_TREE

    def take(self, n: int) -> array:
        """Move n free blocks to HELD, as one lease. The caller has checked that n <= free_count."""
        free = self._free
        cut = len(free) - n
        if cut >= 0:
            taken = free[: cut - 1 : -1] if cut else free[::-1]  # the last n, top of the stack first
            del free[cut:]
        else:  # the whole stack, then ids never handed out, in the order the full stack would give them
            taken = free[::-1]
            del free[:]
            taken.extend(range(self._fresh, self._fresh - cut))
            self._fresh -= cut
        if taken:
            self._leases[taken[0]] = taken[:]  # a copy: the caller may change its array
        self.held += n
        return taken

    def release_tree(self, blocks: array) -> None:
        """Move IN_TREE blocks (just detached from the tree) back to FREE."""
        self._free.extend(blocks)

    def release_held(self, blocks: array) -> None:
        """Move HELD blocks back to FREE. The caller has validated them (distinct and held)."""
        self._unhold(blocks)
        self._free.extend(blocks)

    def adopt(self, blocks: array) -> None:
        """Move HELD blocks into the tree. The caller has validated them (distinct and held)."""
        self._unhold(blocks)

    def check_held(self, blocks: array, what: str) -> None:
        """Raise BlockStateError unless every (already normalised) block is HELD."""
        if self.lease_cover(blocks, 0, len(blocks)) is not None:
            return
        loose = self._loosen()
        for index, block in enumerate(blocks):
            if block not in loose:
                raise BlockStateError(
                    f"{what}: block {block} (index {index}) is {STATE_NAMES[self.state_of(block)]}, "
                    "not held by the caller"
                )

    def is_held(self, block: int) -> bool:
        """Whether one (in-range) block is HELD: the exact per-block test of the slow paths."""
        return block in self._loosen()

    def lease_cover(self, ids: array, start: int, stop: int) -> list[tuple[array, int]] | None:
        """Prove `ids[start:stop]` held from whole leases or lease prefixes, each used once, or return None.

        Returns [(lease, k), ...]: ids[start:stop] is lease_1[:k_1] + lease_2[:k_2] + ... `ids` must be a block-id
        array: an array never equals a list, so anything else is simply not covered.
        """
        leases = self._leases
        if start < stop:  # the common case first: one whole lease, as `allocate` handed it out
            lease = leases.get(ids[start])
            if lease is not None and len(lease) == stop - start and ids[start:stop] == lease:
                return [(lease, stop - start)]
        cover: list[tuple[array, int]] = []
        i = start
        while i < stop:
            lease = leases.get(ids[i])
            if lease is None:
                return None
            k = len(lease)
            if k > stop - i:  # a prefix of the lease
                k = stop - i
                if ids[i:stop] != lease[:k]:
                    return None
            elif ids[i : i + k] != lease:
                return None
            if cover and any(lease is used for used, _ in cover):  # the same lease twice: repeated ids
                return None
            cover.append((lease, k))
            i += k
        return cover

    def adopt_cover(self, cover: list[tuple[array, int]], n: int) -> array:
        """Move the first n blocks of a `lease_cover` from HELD into the tree; return them (the pool's copy)."""
        leases = self._leases
        if len(cover) == 1 and cover[0][1] == n == len(cover[0][0]):  # one whole lease: it becomes the result
            lease = cover[0][0]
            del leases[lease[0]]
            self.held -= n
            return lease
        out = block_ids()
        for lease, k in cover:
            if n <= 0:
                break
            used = min(k, n)
            del leases[lease[0]]
            if used < len(lease):
                rest = lease[used:]
                leases[rest[0]] = rest
                out.extend(lease[:used])
            elif not out:
                out = lease  # the lease itself: it leaves `leases` above, so nothing else refers to it
            else:
                out.extend(lease)
            n -= used
        self.held -= len(out)
        return out

    def _unhold(self, blocks: array) -> None:
        cover = self.lease_cover(blocks, 0, len(blocks))
        if cover is not None:
            self.adopt_cover(cover, len(blocks))
            return
        self._loosen().difference_update(blocks)
        self.held -= len(blocks)

    def _loosen(self) -> set[int]:
        """Dissolve every lease into the loose set (the exact per-block view of HELD); return that set."""
        loose = self._loose
        if self._leases:
            for lease in self._leases.values():
                loose.update(lease)
            self._leases.clear()
        return loose

    def normalize(self, blocks: Iterable[int], what: str) -> array:
        """Return `blocks` as a block-id array of distinct ids in [0, capacity), or raise BlockStateError."""
        if type(blocks) is not array and type(blocks) is not list and type(blocks) is not tuple:
            blocks = list(blocks)  # read once: a generator's bools are seen below
        try:
            ids = list(map(operator.index, blocks))
        except TypeError as exc:
            raise BlockStateError(f"{what}: block ids must be ints ({exc})") from None
        if ids and (min(ids) < 0 or max(ids) >= self.capacity):
            bad = next(b for b in ids if not 0 <= b < self.capacity)
            raise BlockStateError(f"{what}: block {bad} is outside [0, {self.capacity})")
        arr = block_ids(ids)
        if type(blocks) is not array and (at := bool_at(blocks, arr)) is not None:  # type: ignore[arg-type]
            raise BlockStateError(f"{what}: block ids must be ints, not bools (blocks[{at}] is {blocks[at]!r})")
        if len(set(ids)) != len(ids):
            seen: set[int] = set()
            dup = next(b for b in ids if b in seen or seen.add(b))  # type: ignore[func-returns-value]
            raise BlockStateError(f"{what}: block {dup} appears more than once")
        return arr

    def free_list(self) -> list[int]:
        """The free stack, bottom first (O(capacity): for tests of small pools)."""
        return [*range(self.capacity - 1, self._fresh - 1, -1), *self._free]

    def freed(self) -> array:
        """The free stack's ids that were handed out before (above the never-used ones), bottom first."""
        return self._free[:]
