"""Synthetic workloads: seeded, deterministic, in arrival order, and shaped as their docstrings say."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from radixcache.synthetic import GENERATORS, agent_loops, few_shot, multi_turn_chat, rag


def digest(requests: list) -> str:
    return hashlib.sha1(repr(requests).encode()).hexdigest()


def test_multi_turn_chat_output_is_unchanged() -> None:
    # Pinned: a benchmark depends on this exact workload.
    assert digest(multi_turn_chat()) == "8aa1bef5f94f456e94dd4235c290a92ba91cd49e"


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators_are_seeded_and_in_arrival_order(name: str) -> None:
    make = GENERATORS[name]
    a, b, c = make(seed=5), make(seed=5), make(seed=6)
    assert digest(a) == digest(b) != digest(c)
    stamps = [r.timestamp_ms for r in a]
    assert stamps == sorted(stamps)
    assert all(r.output_tokens is not None and len(r.output_tokens) == r.output_length for r in a)


def common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_agent_fan_out_branches_arrive_together_and_share_the_prefix() -> None:
    requests = agent_loops(agents=20, fanout_prob=1.0, fanout=(3, 3), steps=(2, 2), tool_tokens=100, seed=1)
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
    requests = agent_loops(agents=1, fanout_prob=0.0, steps=(5, 5), seed=2)
    lengths = [len(r.tokens) for r in requests]
    assert lengths == sorted(lengths) and len(set(lengths)) == 5
    for before, after in itertools.pairwise(requests):
        assert after.tokens[: len(before.tokens)] == before.tokens


def test_rag_shares_documents_in_varying_order() -> None:
    requests = rag(queries=200, documents=20, docs_per_query=(3, 3), doc_tokens=50, system_tokens=10, seed=3)
    firsts = {r.tokens[10:60] for r in requests}  # the first document after the system prompt
    assert 1 < len(firsts) < 20
    assert all(r.tokens[:10] == requests[0].tokens[:10] for r in requests)


def test_few_shot_batches_share_instruction_and_shots() -> None:
    requests = few_shot(batches=5, batch_size=(4, 4), shots=(2, 2), instruction_tokens=30, seed=4)
    assert len(requests) == 20
    for start in range(0, 20, 4):
        batch = requests[start : start + 4]
        shared = min(common_prefix(batch[0].tokens, r.tokens) for r in batch[1:])
        assert shared >= 30 + 2 * 60  # instruction and two shots (examples are at least half their mean)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        agent_loops(steps=(3, 2))
    with pytest.raises(ValueError):
        rag(documents=2, docs_per_query=(3, 4))
    with pytest.raises(ValueError):
        few_shot(shots=(2, 99), pool=16)
