"""Synthetic workloads: seeded, deterministic, in arrival order, streamed, and shaped as their docstrings say."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from radixcache.trace.synthetic import GENERATORS, agent_loops, few_shot, multi_turn_chat, rag

REPO = Path(__file__).resolve().parents[2]


def digest(requests: Iterable) -> str:
    return hashlib.sha1(repr(list(requests)).encode()).hexdigest()


def test_multi_turn_chat_output_is_unchanged() -> None:
    # Pinned: a benchmark depends on this exact workload.
    assert digest(multi_turn_chat()) == "8aa1bef5f94f456e94dd4235c290a92ba91cd49e"


# Pinned from the earlier list-then-sort generators: streaming them changed no request and no order, ties
# (zero gaps, overlapping few-shot batches) included.
PINNED = [
    (
        lambda: multi_turn_chat(conversations=30, mean_interarrival_ms=0, mean_think_ms=0, system_tokens=20, seed=1),
        "f36c251f1649735d9fd0962591eb2c227ed9ea11",
    ),
    (lambda: agent_loops(agents=40, tool_tokens=200, seed=2), "1751d4334103c31a8c54609d12d53e37ac816d53"),
    (
        lambda: agent_loops(agents=20, tool_tokens=50, mean_interarrival_ms=0, mean_step_ms=0, fanout_prob=0.5, seed=3),
        "c2dff97070e932cf4438f9ebac088bf643b59327",
    ),
    (lambda: rag(queries=300, seed=4), "70e47d6a88876b62d84856e0db1a723715993866"),
    (lambda: few_shot(seed=5), "9b8c4842dc67260eaaf9cf0aadde72c58c02772f"),
    (lambda: few_shot(batches=200, mean_interarrival_ms=5.0, seed=6), "8088097f0e38925d6fb480fae672ac292848c2f2"),
]


@pytest.mark.parametrize(("make", "expected"), PINNED)
def test_streamed_output_equals_the_sorted_list_it_replaced(make: Callable[[], Iterable], expected: str) -> None:
    assert digest(make()) == expected


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators_are_seeded_and_in_arrival_order(name: str) -> None:
    make = GENERATORS[name]
    a, b, c = list(make(seed=5)), list(make(seed=5)), list(make(seed=6))
    assert digest(a) == digest(b) != digest(c)
    stamps = [r.timestamp_ms for r in a]
    assert stamps == sorted(stamps)
    assert all(r.output_tokens is not None and len(r.output_tokens) == r.output_length for r in a)


# Measured in a fresh interpreter: tracemalloc counts every thread's allocations, and a test process may have
# others (pytest-xdist's channel, a finished test's engine) allocating while the generator runs; and what earlier
# tests left on the interpreter's free lists would change the figures.
PEAK_PROBE = """
import sys, tracemalloc
from radixcache.trace.synthetic import agent_loops, multi_turn_chat

def make(n):
    if sys.argv[1] == "chat":
        return multi_turn_chat(conversations=n, system_tokens=20, user_tokens=4, assistant_tokens=4, turns=(2, 6))
    return agent_loops(agents=n // 2, steps=(2, 5), mean_interarrival_ms=200, tool_tokens=20, task_tokens=4,
                       action_tokens=4, observation_tokens=4, branch_tokens=2)

def peak_bytes(requests):
    # peak traced memory while consuming `requests` one at a time (checking arrival order)
    tracemalloc.start()
    last = float("-inf")
    for r in requests:
        assert r.timestamp_ms >= last
        last = r.timestamp_ms
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak

# Warm up at the large size: the interpreter keeps freed small tuples on free lists, which tracemalloc still
# counts, and the first large run would fill them.
peak_bytes(make(5_000))
print(peak_bytes(make(500)), peak_bytes(make(5_000)))
"""


@pytest.mark.parametrize("generator", ["chat", "agent"])
def test_generators_stream_in_constant_memory(generator: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, generator], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    small, large = map(int, done.stdout.split())
    assert large < 2 * small, (small, large)  # ten times the requests, about the same memory: the live ones


def common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_agent_fan_out_branches_arrive_together_and_share_the_prefix() -> None:
    requests = list(agent_loops(agents=20, fanout_prob=1.0, fanout=(3, 3), steps=(2, 2), tool_tokens=100, seed=1))
    by_agent: dict[str, list] = {}
    for r in requests:
        by_agent.setdefault(r.session, []).append(r)
    for steps in by_agent.values():
        first = steps[:3]
        assert len({r.timestamp_ms for r in first}) == 1
        shared = min(common_prefix(first[0].tokens, r.tokens) for r in first[1:])
        assert shared >= 100  # at least the tool prompt
        # the next step's context holds every branch's output
        merged = sum((r.output_tokens for r in first), ())
        nxt = steps[3].tokens
        assert any(nxt[i : i + len(merged)] == merged for i in range(len(nxt) - len(merged) + 1))


def test_agent_scratchpad_grows_each_step() -> None:
    requests = list(agent_loops(agents=1, fanout_prob=0.0, steps=(5, 5), seed=2))
    lengths = [len(r.tokens) for r in requests]
    assert lengths == sorted(lengths) and len(set(lengths)) == 5
    for before, after in itertools.pairwise(requests):
        assert after.tokens[: len(before.tokens)] == before.tokens


def test_rag_shares_documents_in_varying_order() -> None:
    requests = list(rag(queries=200, documents=20, docs_per_query=(3, 3), doc_tokens=50, system_tokens=10, seed=3))
    firsts = {r.tokens[10:60] for r in requests}  # the first document after the system prompt
    assert 1 < len(firsts) < 20
    assert all(r.tokens[:10] == requests[0].tokens[:10] for r in requests)


def test_few_shot_batches_share_instruction_and_shots() -> None:
    requests = list(few_shot(batches=5, batch_size=(4, 4), shots=(2, 2), instruction_tokens=30, seed=4))
    assert len(requests) == 20
    for start in range(0, 20, 4):
        batch = requests[start : start + 4]
        shared = min(common_prefix(batch[0].tokens, r.tokens) for r in batch[1:])
        assert shared >= 30 + 2 * 60  # instruction and two shots (examples are at least half their mean)


def test_ranges_may_be_lists() -> None:
    assert list(multi_turn_chat(conversations=2, turns=[1, 2])) == list(multi_turn_chat(conversations=2, turns=(1, 2)))


def test_bad_arguments_are_refused() -> None:
    # on the call, before any request is made (the CLI reports them before it opens the output file)
    with pytest.raises(ValueError):
        multi_turn_chat(turns=(0, 2))
    with pytest.raises(ValueError):
        agent_loops(steps=(3, 2))
    with pytest.raises(ValueError):
        rag(documents=2, docs_per_query=(3, 4))
    with pytest.raises(ValueError):
        few_shot(shots=(2, 99), pool=16)


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("chat", "vocab", 0),
        ("chat", "user_tokens", -1),
        ("chat", "mean_think_ms", float("inf")),
        ("chat", "mean_interarrival_ms", float("nan")),
        ("agent", "observation_tokens", -1),
        ("agent", "mean_step_ms", float("inf")),
        ("agent", "fanout_prob", float("nan")),
        ("agent", "vocab", 2**63 + 1),  # ids past int64: a trace its readers refuse
        ("agent-sessions", "vocab", -1),
        ("agent-sessions", "mean_interarrival_ms", float("inf")),
        ("rag", "answer_tokens", -1),
        ("rag", "order_noise", float("inf")),
        ("rag", "zipf", float("inf")),  # one document with a weight: a query for 3 never finished
        ("rag", "zipf", float("nan")),
        ("rag", "zipf", 1e300),
        ("rag", "zipf", -1e300),
        ("few-shot", "query_tokens", -1),
        ("few-shot", "fixed_shots_prob", 2.0),
        ("few-shot", "mean_interarrival_ms", -1.0),
        # a float count failed with "'float' object cannot be interpreted as an integer", a string range on a
        # comparison, and True passed as 1
        ("chat", "conversations", 1.5),
        ("chat", "conversations", True),
        ("chat", "turns", "ab"),
        ("chat", "user_tokens", 2.5),
        ("chat", "seed", 1.5),
        ("agent", "fanout", (2, 4.5)),
        ("agent-sessions", "agents", 1.5),
        ("agent-sessions", "tool_output_tokens", "ab"),
        ("rag", "queries", 1.5),
        ("rag", "docs_per_query", (3,)),
        ("few-shot", "batch_size", "ab"),
        ("few-shot", "vocab", 100.0),
    ],
)
def test_every_argument_is_checked_on_the_call(name: str, field: str, value: object) -> None:
    """The docstring's promise: a bad argument is a ValueError naming it when the generator is called, never an
    error (or a hang) half-way through the requests, which left `trace gen` with a partial file."""
    with pytest.raises(ValueError, match=field):
        GENERATORS[name](**{field: value})
