"""The infinite bound by sequence (radixcache.sim.prefixes.PrefixSet): against a naive set of every prefix, and
through InfiniteReplay against a tree that never evicts."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.sim.infinite_replay import InfiniteReplay
from radixcache.sim.prefixes import PrefixSet
from radixcache.sim.replay_common import drive
from radixcache.sim.simulation import infinite_capacity, simulate
from radixcache.trace.workload import SimRequest, Workload

# Sequences over a small alphabet, so that they share prefixes, extend each other and repeat; some tokens need all
# eight bytes (a shared prefix of bytes may end inside a token).
tokens = st.sampled_from([0, 1, 2, 255, 256, 2**40, 2**63 - 1])
sequences = st.lists(tokens, max_size=12)
operations = st.lists(st.tuples(st.booleans(), st.sampled_from([None, "a", "b"]), sequences), max_size=60)


def as_bytes(sequence: list[int]) -> bytes:
    return array("q", sequence).tobytes()


@settings(max_examples=150, deadline=None)  # was 400 before the fast test path (issue 30)
@given(operations)
def test_prefix_set_answers_what_a_set_of_every_prefix_does(ops: list[tuple[bool, str | None, list[int]]]) -> None:
    prefixes = PrefixSet()
    naive: set[tuple[str | None, tuple[int, ...]]] = set()

    def naive_longest(namespace: str | None, sequence: list[int]) -> int:
        n = 0
        while n < len(sequence) and (namespace, tuple(sequence[: n + 1])) in naive:
            n += 1
        return n

    for insert, namespace, sequence in ops:
        expected = naive_longest(namespace, sequence)
        if insert:
            assert prefixes.add(namespace, as_bytes(sequence)) == expected
            naive.update((namespace, tuple(sequence[:k])) for k in range(1, len(sequence) + 1))
        else:
            assert prefixes.longest(namespace, as_bytes(sequence)) == expected


@st.composite
def token_workloads(draw: st.DrawFn) -> Workload:
    """Conversations over a few system prompts, with outputs, namespaces and page sizes of 1 to 3 tokens."""
    page = draw(st.integers(1, 3))
    systems = [tuple(range(100 * s, 100 * s + draw(st.integers(0, 5)))) for s in range(2)]
    histories: list[tuple[int, ...]] = []
    fresh = iter(range(1000, 10**6))
    requests = []
    for i in range(draw(st.integers(1, 25))):
        if histories and draw(st.booleans()):
            k = draw(st.integers(0, len(histories) - 1))
            prompt = histories[k] + tuple(next(fresh) for _ in range(draw(st.integers(0, 4))))
        else:
            prompt = draw(st.sampled_from(systems)) + tuple(next(fresh) for _ in range(draw(st.integers(0, 4))))
            histories.append(prompt)
            k = len(histories) - 1
        output = tuple(next(fresh) for _ in range(draw(st.integers(0, 3))))
        histories[k] = prompt + output
        namespace = draw(st.sampled_from([None, None, "tenant"]))
        requests.append(SimRequest(float(i), prompt, output, len(prompt), 1, namespace))
    return Workload(tuple(requests), page_size=page, block_tokens=page, kind="token")


@settings(max_examples=100, deadline=None)  # was 200 before the fast test path (issue 30)
@given(token_workloads(), st.integers(1, 3))
def test_the_bound_by_sequence_equals_a_tree_that_never_evicts(workload: Workload, concurrency: int) -> None:
    tree = simulate(workload, infinite_capacity(workload), concurrency=concurrency, check=True)
    assert tree.evicted_blocks == 0
    replay = InfiniteReplay(workload, concurrency=concurrency, chained=True)
    drive(workload, [replay], None)
    result = replay.result()
    assert (result.hit_tokens, result.hit_blocks, result.prompt_blocks) == (
        tree.hit_tokens,
        tree.hit_blocks,
        tree.prompt_blocks,
    )
    p = workload.page_size
    pages = {
        (r.namespace, tuple((r.prompt + r.output)[: k * p]))
        for r in workload.requests
        for k in range(1, len(r.prompt + r.output) // p + 1)
    }
    assert result.capacity_blocks == max(1, len(pages))  # the distinct pages it would hold
