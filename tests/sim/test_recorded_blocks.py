"""Block figures of a trace an engine recorded: its partial last page counts as a block, as in a trace that looks it
up, and always misses (the engine's tree never holds a partial page). Checked against a brute-force recompute."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.sim.simulation import simulate, simulate_infinite
from radixcache.sim.tiers import TierConfig
from radixcache.trace import HashRequest
from radixcache.trace.workload import hash_workload

BLOCK = 4

_request = st.tuples(
    st.lists(st.integers(1, 6), min_size=1, max_size=4),  # prompt ids, drawn from a few so prefixes repeat
    st.integers(0, BLOCK - 1),  # tokens the last block lacks (0: a whole page)
    st.lists(st.integers(100, 104), max_size=2),  # output ids
)


def _chained(pages: list[int], ids: dict[tuple[int, ...], int]) -> tuple[int, ...]:
    """One id per prefix of `pages`, as a Mooncake trace's ids are (an id names its whole prefix)."""
    return tuple(ids.setdefault(tuple(pages[: n + 1]), len(ids) + 1) for n in range(len(pages)))


def _requests(drawn: list, recorded: bool) -> list[HashRequest]:
    ids: dict[tuple[int, ...], int] = {}
    requests = []
    for i, (prompt, short, out) in enumerate(drawn):
        whole = len(prompt) - (short > 0)
        chained = _chained([*prompt[:whole], *out], ids)
        hash_ids = (*chained[:whole], *_chained(prompt, ids)[whole:])
        output = chained[whole:] if recorded else None
        produced = BLOCK * len(out) + 1  # enough output tokens for the output pages (the reader checks it)
        requests.append(HashRequest(float(i), BLOCK * len(prompt) - short, produced, hash_ids, output_hash_ids=output))
    return requests


def _brute_force_hits(drawn: list) -> int:
    """Blocks hit by recorded requests one at a time in an unbounded cache: the leading whole pages of a prompt that
    an earlier request inserted (its prompt's whole pages, then its output ids); a partial page never hits."""
    cached: set[tuple[int, ...]] = set()
    hits = 0
    for ids, short, out in drawn:
        whole = len(ids) - (short > 0)
        k = 0
        while k < whole and tuple(ids[: k + 1]) in cached:
            k += 1
        hits += k
        pages = [*ids[:whole], *out]
        cached.update(tuple(pages[: n + 1]) for n in range(len(pages)))
    return hits


@settings(max_examples=40, deadline=None)
@given(st.lists(_request, min_size=1, max_size=8))
def test_a_recorded_trace_counts_its_partial_last_page_as_a_block_that_misses(drawn: list) -> None:
    """Regression: a recorded request counted only its prompt's whole pages as prompt blocks, so a trace of two
    requests (1, 2) of 6 tokens at 4 a block gave 2 prompt blocks recorded and 4 looked up in full."""
    expected_blocks = sum(len(ids) for ids, _, _ in drawn)  # one per hash id, the partial last one included
    recorded = hash_workload(_requests(drawn, True), BLOCK)
    hits = _brute_force_hits(drawn)
    runs = [
        simulate(recorded, 1000, "lru", check=True),
        simulate(recorded, 1000, "belady", check=True),
        simulate_infinite(recorded),
        simulate(recorded, 1000, tiers=TierConfig(8, None), check=True),
    ]
    for result in runs:
        assert (result.prompt_blocks, result.hit_blocks) == (expected_blocks, hits)
    unrecorded = simulate(hash_workload(_requests(drawn, False), BLOCK), 1000, "lru")
    assert unrecorded.prompt_blocks == expected_blocks
