"""Requests cross the read-ahead pipe packed (radixcache.sim.packing) and come out as they went in, with
int64 arrays for their ids; a token trace read ahead gives the figures of one read in this process."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.sim.evaluation import evaluate
from radixcache.sim.packing import RequestPacker, unpack_requests
from radixcache.sim.simulation import simulate
from radixcache.sim.source import open_source
from radixcache.trace.workload import SimRequest

ids = st.lists(
    st.one_of(st.integers(0, 70_000), st.integers(0, 2**40), st.integers(-(2**63), 2**63 - 1), st.just(2**63)),
    max_size=6,
)
requests = st.builds(
    SimRequest,
    st.floats(0, 1e6),
    ids.map(tuple),
    st.one_of(st.just(()), ids.map(tuple)),
    st.integers(0, 10**6),
    st.sampled_from([1, 16, 512]),
    st.one_of(st.none(), st.text(max_size=3)),
    st.one_of(st.none(), st.text(max_size=3)),
    st.one_of(st.none(), st.integers(0, 99)),
    st.booleans(),
    st.one_of(st.none(), st.floats(0, 1e6)),
    st.one_of(st.none(), st.floats(0, 1e9)),  # retain_for
)


def as_tuples(r: SimRequest) -> SimRequest:
    return r._replace(prompt=tuple(r.prompt), output=tuple(r.output))


@settings(max_examples=100, deadline=None)  # was 300 before the fast test path (issue 30)
@given(st.lists(st.lists(requests, max_size=5), min_size=1, max_size=4))
def test_packed_batches_unpack_to_the_same_requests(batches: list[list[SimRequest]]) -> None:
    packer = RequestPacker()
    for batch in batches:
        for r in batch:
            packer.add(r)
        assert len(packer) == len(batch)
        crossed = pickle.loads(pickle.dumps(packer.take()))
        assert len(packer) == 0
        out = unpack_requests(crossed)
        assert [as_tuples(r) for r in out] == batch
        for r, given_r in zip(out, batch, strict=True):
            fits = all(-(2**63) <= i < 2**63 for i in (*given_r.prompt, *given_r.output))
            assert (type(r.prompt).__name__ == "array") == fits  # an id past int64 crosses as it was
            if not given_r.output:
                assert r.output == ()


def test_ids_cross_at_the_narrowest_width() -> None:
    def typecode(*prompts: tuple[int, ...]) -> str:
        packer = RequestPacker()
        for p in prompts:
            packer.add(SimRequest(0.0, p, (), len(p)))
        return packer.take().typecode

    assert typecode((1, 65535), ()) == "H"
    assert typecode((1,), (65536,)) == "I"
    assert typecode((2**32,)) == "q"
    assert typecode((-1, 5)) == "q"


def _token_trace(path: Path, count: int) -> None:
    with path.open("w") as out:
        for i in range(count):
            session = i % 7
            prompt = [session, *range(100, 100 + 30 + 5 * (i // 7)), 70_000 + i]
            out.write(json.dumps({"timestamp": i, "tokens": prompt, "output_length": 2, "output_tokens": [i, 3]}))
            out.write("\n")


def test_a_token_trace_read_ahead_gives_the_figures_of_one_read_here(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    _token_trace(path, 600)
    here = open_source(path)
    ahead = replace(here, read_ahead=True)
    assert [as_tuples(r) for r in ahead] == [as_tuples(r) for r in here]
    for policy in ("lru", "reuse"):
        a, b = simulate(ahead, 300, policy), simulate(here, 300, policy)
        assert (a.hit_tokens, a.evicted_blocks, a.windows) == (b.hit_tokens, b.evicted_blocks, b.windows)
    ra, rb = evaluate(ahead, 300, "lru", belady=True), evaluate(here, 300, "lru", belady=True)
    assert ra.infinite == replace(rb.infinite, seconds=ra.infinite.seconds)  # type: ignore[union-attr,arg-type]
    assert ra.belady.hit_tokens == rb.belady.hit_tokens  # type: ignore[union-attr]
