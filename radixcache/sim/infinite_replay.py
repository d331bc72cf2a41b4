"""The replay through a cache that never evicts (`InfiniteReplay`), kept as a table instead of a tree: the
infinite-cache bound, in a few bytes per distinct page."""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence

from radixcache.errors import RadixCacheError
from radixcache.sim.infinite_ids import id_range, match_chunk
from radixcache.sim.inflight import InFlight
from radixcache.sim.prefixes import PrefixSet
from radixcache.sim.replay_common import Replayable, prompt_blocks, replay_figures, shared_early
from radixcache.sim.results import SimResult
from radixcache.sim.timeline import Timeline
from radixcache.tokens import as_token_array
from radixcache.trace.workload import SimRequest


class InfiniteReplay:
    """A cache that never evicts, kept as a table instead of a tree: the same hits as a RadixCache that nothing
    fills, in a few bytes per distinct page.

    Hash traces (page size 1, ids below 2**27): a page is its hash id, and `parent[id]` the id before it (or the
    root), kept in an int64 array indexed by id, 8 bytes per id up to the largest. A prompt hits its leading ids
    whose recorded parent is the id before them. That is exact as long as every id follows one parent throughout
    the trace, which chained block hashes guarantee; a trace where an id follows two parents (or an id is too
    large for the array) marks the replay `broken`, and the caller replays it again with `chained=True`, by
    sequence. By sequence (token traces, and that fallback): each inserted sequence is kept (a sorted list of int64
    bytes, radixcache.sim.prefixes), a prompt hits the whole pages it shares with the closest one, and a
    sequence that a later one extends is dropped; exact, with no hashing.
    By id at concurrency 1, requests are matched in chunks, in numpy (radixcache.sim.infinite_ids), with the
    same figures.
    """

    def __init__(
        self,
        workload: Replayable,
        *,
        concurrency: int = 1,
        chained: bool = False,
        windows: int = 20,
        span: tuple[float, float] | None = None,
        chunk_ids: int | None = 1 << 15,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
        self.page_size, self.block_tokens, self.concurrency = workload.page_size, workload.block_tokens, concurrency
        # By id for hash traces (a token trace's ids follow many parents: it goes by sequence from the start).
        self.by_id = self.page_size == 1 and not chained and getattr(workload, "kind", None) == "hash"
        self.broken = False  # by id, an id followed two parents: the figures are void, replay by sequence
        self.parent = array("q")  # by id: 0 unseen, 1 the root, id + 2 the id before it
        self.distinct = 0
        self.prefixes = PrefixSet()  # not by id: the sequences inserted, as int64 bytes
        self.timeline = Timeline(windows, span)
        self.inflight = InFlight(concurrency)
        self.prompt_blocks = self.hit_blocks = 0
        self.seconds = 0.0
        # By id at concurrency 1, requests are matched a chunk of `chunk_ids` ids at a time (None: one at a time;
        # radixcache.sim.infinite_ids) until one arrives that an engine recorded (it finishes at its own time):
        # from then on, one at a time.
        self.chunked = self.by_id and concurrency == 1 and chunk_ids is not None
        self.chunk_size = chunk_ids or 0
        self.gathered_ids = array("q")
        self.chunk: list[SimRequest] = []

    def feed(self, index: int, request: SimRequest) -> None:
        if self.broken:
            return
        started = time.perf_counter()
        if self.chunked:
            if request.namespace is None and request.finish_ms is None and not request.output:
                try:
                    self.gathered_ids.extend(request.prompt)
                except (OverflowError, TypeError):  # an id past int64: past the parent array's limit too
                    self.broken = True
                    return
                self.chunk.append(request)
                if len(self.gathered_ids) >= self.chunk_size:
                    self._match_chunk()
                self.seconds += time.perf_counter() - started
                return
            self._match_chunk()
            self.chunked = False
            if self.broken:
                return
        for item in self.inflight.due(request.timestamp_ms):
            self._insert(*item)
        p = self.page_size
        root = ("namespace", request.namespace)
        full = request.prompt + request.output if request.output else request.prompt
        prompt_pages = len(request.prompt) // p
        matched = 0
        if self.by_id:
            prompt = request.prompt
            if request.namespace is not None or not self._room_for(full):  # the pages it will insert too
                self.broken = True
                return
            # The hit is the longest run of leading ids whose recorded parent is the id before them. Prefix
            # equality is monotone in the length, so a binary search over C-level list comparisons finds it.
            got = list(map(self.parent.__getitem__, prompt))
            want = [_ROOT, *map(_ENCODE, prompt[:-1])]
            low, high = 0, len(prompt)
            while low < high:
                mid = (low + high + 1) // 2
                if got[:mid] == want[:mid]:
                    low = mid
                else:
                    high = mid - 1
            matched = low
            early = shared_early(request, len(full), 1)
            if early > matched:  # shared while it runs (see `shared_early`)
                self._insert(root, full[:early], matched)
            self.inflight.add((root, full, max(matched, early)), request.finish_ms)
        else:
            # The whole pages, as int64 bytes (radixcache.sim.prefixes); a bad token raises as the tree would.
            data = as_token_array(full)[: len(full) // p * p].tobytes()
            namespace = request.namespace
            matched = self.prefixes.longest(namespace, data[: prompt_pages * p * _TOKEN_BYTES]) // p
            early = shared_early(request, len(full) // p, p)
            if early:  # shared while it runs (see `shared_early`)
                self._insert(namespace, data[: early * p * _TOKEN_BYTES], 0)
            self.inflight.add((namespace, data, 0), request.finish_ms)
        self.prompt_blocks += prompt_blocks(request, p)
        self.hit_blocks += matched
        self.timeline.add(
            request.timestamp_ms, request.prompt_tokens, min(matched * p * request.unit, request.prompt_tokens)
        )
        self.seconds += time.perf_counter() - started

    def _match_chunk(self) -> None:
        """Match and record the chunk of requests gathered so far, one after the other."""
        chunk, ids = self.chunk, self.gathered_ids
        self.chunk, self.gathered_ids = [], array("q")
        if not chunk:
            return
        if ids:
            low, top = id_range(ids)
            if low < 0 or not self._room_for_id(top):
                self.broken = True
                return
        matched = match_chunk(self.parent, ids, [len(request.prompt) for request in chunk])
        if matched is None:  # an id after two parents
            self.broken = True
            return
        hits, self.distinct = matched[0], self.distinct + matched[1]
        add = self.timeline.add
        for request, hit in zip(chunk, hits, strict=True):
            self.prompt_blocks += prompt_blocks(request, 1)
            self.hit_blocks += hit
            tokens = request.prompt_tokens
            add(request.timestamp_ms, tokens, min(hit * request.unit, tokens))

    def _insert(self, root: object, pages: Sequence[int], known: int) -> None:
        """Record a finished request's pages (`known` leading ones were matched, so they are there already)."""
        if not self.by_id:  # `root` is the namespace, `pages` the int64 bytes of whole pages
            known_tokens = self.prefixes.add(root, pages)  # type: ignore[arg-type]
            self.distinct += len(pages) // _TOKEN_BYTES // self.page_size - known_tokens // self.page_size
            return
        parent = self.parent
        prev = pages[known - 1] + 2 if known else _ROOT
        for page in pages[known:]:
            recorded = parent[page]
            if not recorded:
                parent[page] = prev
                self.distinct += 1
            elif recorded != prev:  # one id after two parents: not a chained-hash trace
                self.broken = True
                return
            prev = page + 2

    def _room_for(self, prompt: Sequence[int]) -> bool:
        """Grow the parent array to hold every id of `prompt` (doubling); False past the array's limit."""
        return not prompt or self._room_for_id(max(prompt))

    def _room_for_id(self, top: int) -> bool:
        """Grow the parent array to hold id `top` (doubling); False past the array's limit."""
        if top < len(self.parent):
            return True
        if top >= _MAX_IDS:
            return False
        grow = max(top + 1, 2 * len(self.parent), 1024) - len(self.parent)
        self.parent.frombytes(bytes(8 * grow))
        return True

    def close(self) -> None:
        if self.chunked and not self.broken:
            started = time.perf_counter()
            self._match_chunk()
            self.seconds += time.perf_counter() - started
        for item in self.inflight.drain():
            if self.broken:
                break
            self._insert(*item)

    def summary(self) -> tuple[bool, SimResult | None]:
        """(broken, the result unless broken): what a replay beside the reading (ReadAhead) sends back."""
        return self.broken, (None if self.broken else self.result())

    def result(self) -> SimResult:
        if self.broken:
            raise RadixCacheError("an id followed two parents: replay this trace by sequence (chained=True)")
        return replay_figures(self, "lru", max(1, self.distinct), 0, 0)


_ROOT = 1  # the parent of a prompt's first id
_TOKEN_BYTES = 8  # an int64 token's bytes
_ENCODE = (2).__add__  # an id as the parent of the next one
_MAX_IDS = 1 << 27  # the parent array's limit: 1 GiB
