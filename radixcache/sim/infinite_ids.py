"""The infinite-cache bound over hash ids, a chunk of requests at a time, in numpy.

The infinite replay (radixcache.sim.infinite_replay) keeps, per hash id, the id recorded before it (`parent`,
an int64 array indexed by id: 0 unseen, 1 the root, id + 2 the id before it). A prompt hits its leading ids whose
recorded parent is the id before them. At concurrency 1 each request's ids are recorded before the next request
arrives, so for a chunk of requests an id hits iff it was recorded before the chunk or first read by an earlier
request of the chunk, and its recorded parent is the one it has here; this module computes that for the whole chunk
with a stable sort by id instead of a Python loop per id.

An id that follows two different parents (within the chunk, or against what was recorded) makes the chunk's figures
void, as it does for the per-request replay: `match_chunk` then returns None and records nothing.
"""

from __future__ import annotations

from array import array

import numpy as np

_ROOT = 1  # the recorded parent of a prompt's first id (InfiniteReplay's encoding)


def id_range(ids: array) -> tuple[int, int]:
    """The smallest and the largest of `ids` (int64, not empty)."""
    flat = np.frombuffer(ids, dtype=np.int64)
    return int(flat.min()), int(flat.max())


def match_chunk(parent: array, ids: array, lengths: list[int]) -> tuple[list[int], int] | None:
    """Each request's matched ids and the number of ids seen for the first time, recording them in `parent`.

    `ids`: the requests' prompts, one after the other (int64, each below len(parent)); `lengths`: ids per request.
    None (and `parent` unchanged) when an id follows two different parents."""
    count = len(ids)
    if not count:
        return [0] * len(lengths), 0
    flat = np.frombuffer(ids, dtype=np.int64)
    sizes = np.array(lengths, dtype=np.int64)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    offset = np.arange(count, dtype=np.int64) - starts[owner]
    want = np.empty(count, dtype=np.int64)  # each id's parent, encoded as `parent` records it
    want[1:] = flat[:-1] + 2
    want[offset == 0] = _ROOT
    table = np.frombuffer(parent, dtype=np.int64)
    recorded = table[flat]
    seen = recorded != 0
    if (seen & (recorded != want)).any():
        return None
    by_id = np.argsort(flat, kind="stable")  # each id's reads together, in reading order
    same = flat[by_id[1:]] == flat[by_id[:-1]]
    if (same & (want[by_id[1:]] != want[by_id[:-1]])).any():
        return None
    # The request that first read each id in the chunk: a later request finds it recorded.
    first = np.ones(count, dtype=bool)
    first[1:] = ~same
    first_owner = np.empty(count, dtype=np.int64)
    first_owner[by_id] = owner[by_id][first][np.cumsum(first) - 1]
    hit = seen | (first_owner < owner)
    # A request matches its leading run of hits: the smallest offset that misses, else its length.
    miss_at = np.where(hit, sizes[owner], offset)
    matched = np.zeros(len(sizes), dtype=np.int64)
    nonempty = sizes > 0
    matched[nonempty] = np.minimum.reduceat(miss_at, starts[nonempty])
    new = by_id[first & ~seen[by_id]]
    table[flat[new]] = want[new]
    del table  # the view must go before `parent` may grow again
    return matched.tolist(), len(new)
