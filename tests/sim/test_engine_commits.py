"""`prefill_chunk` (simulate --prefill-chunk): a recorded request gives the tree its pages as the engine gave them, the
prompt a prefill pass at a time from its match, then each page its decode filled, then its finish insert. The
expected sequences are the engine's, logged from RadixCache.insert while `radixcache replay --policy reuse` ran the
sample with the tiny model (16-token pages, 512-token passes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.errors import RadixCacheError
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.replay_common import prompt_commits
from radixcache.sim.simulation import simulate
from radixcache.trace import HashRequest, write_mooncake
from radixcache.trace.workload import SimRequest, load_workload, token_workload


def _recorded(prompt_tokens: int) -> SimRequest:
    return SimRequest(0.0, tuple(range(prompt_tokens // 16)), (), prompt_tokens, 16, holds_tail=True, finish_ms=1.0)


@pytest.mark.parametrize(
    ("prompt_tokens", "matched", "commits"),
    [
        (1051, 0, [32, 64, 65]),  # a first turn: passes end at 512, 1,024 and 1,051 tokens
        (1092, 62, [68]),  # a next turn that hit 992 tokens: one pass of 100
        (679, 1, [33, 42]),  # a hit of one page: passes from token 16
        (2048, 0, [32, 64, 96, 128]),  # whole pages throughout
    ],
)
def test_the_prompt_enters_a_pass_at_a_time_from_its_match(prompt_tokens: int, matched: int, commits: list) -> None:
    request = _recorded(prompt_tokens)
    early = prompt_tokens // 16
    assert prompt_commits(request, matched, early, 1, 512) == commits
    assert prompt_commits(request, matched, early, 1, None) == [early]


def test_a_pass_smaller_than_a_page_commits_each_page_once() -> None:
    assert prompt_commits(_recorded(64), 0, 4, 1, 10) == [1, 2, 3, 4]  # passes end at 10, 20, 30, 40, 50, 60, 64


def _inserts(tmp_path: Path, chunk: int | None) -> list[tuple[str, int]]:
    """The inserts (and `expect` calls) a reuse replay of one recorded request makes: 1,051 prompt tokens, 8
    generated, so one whole page past the prompt's 65 (the page its tail shares with the reply: 1,058 computed)."""
    path = tmp_path / "r.jsonl"
    line = HashRequest(0.0, 1051, 8, tuple(range(66)), 16, output_hash_ids=(900,), finish_timestamp_ms=50.0)
    write_mooncake(path, [line])
    replay = CacheReplay(load_workload(path), 200, "reuse", prefill_chunk=chunk, check=True)
    log: list[tuple[str, int]] = []
    insert, expect = replay.cache.insert, replay.cache.policy.expect

    def logged_insert(tokens, blocks, **kw) -> int:
        log.append(("insert", len(tokens)))
        return insert(tokens, blocks, **kw)

    def logged_expect(n) -> None:
        log.append(("expect", -1 if n is None else n))
        expect(n)

    replay.cache.insert, replay.cache.policy.expect = logged_insert, logged_expect  # type: ignore[method-assign]
    replay.expect = logged_expect
    replay.feed(0, load_workload(path).requests[0])
    replay.close()
    return log


def test_the_replay_inserts_as_the_engine_did(tmp_path: Path) -> None:
    """As the engine's log goes for such a request (the sample's first turn: 32, 64, 65 pages; its eighth, whose
    decode filled a page: that page, then the finish): inserts of 32, 64, 65 pages (the prompt's passes), 66 (the
    decode's page, its output length unknown), then its finish (expect 8, an insert that adds nothing, None)."""
    assert _inserts(tmp_path, 512) == [
        ("insert", 32),
        ("insert", 64),
        ("insert", 65),
        ("insert", 66),
        ("expect", 8),
        ("insert", 66),
        ("expect", -1),
    ]
    assert _inserts(tmp_path, None) == [("insert", 65), ("expect", 8), ("insert", 66), ("expect", -1)]


def test_a_policy_that_ranks_by_access_gives_the_same_figures(tmp_path: Path) -> None:
    """The commits move no hit under a policy that ranks by access (or by count): pages enter the tree in the same
    order, before anything can evict. (reuse learns one group per insert, and cost prices a node by its insert:
    their figures move.)"""
    path = tmp_path / "r.jsonl"
    lines = []
    for i in range(30):  # three conversations whose turns grow, in a cache that cannot hold all three
        conv, turn = i % 3, i // 3
        ids = tuple(range(conv * 1000, conv * 1000 + 20 + 6 * turn))
        tokens = len(ids) * 16 - 5
        lines.append(HashRequest(100.0 * i, tokens, 4, ids, 16, output_hash_ids=(), finish_timestamp_ms=100.0 * i + 50))
    write_mooncake(path, lines)
    workload = load_workload(path)
    for policy in ("lru", "fifo", "lfu", "slru", "tlru", "agent"):
        assert simulate(workload, 90, policy, prefill_chunk=64).hit_tokens == simulate(workload, 90, policy).hit_tokens


@pytest.mark.parametrize("chunk", [0, -1, 1.5, True, "512"])
def test_a_prefill_chunk_that_is_no_positive_int_is_refused(chunk: object) -> None:
    with pytest.raises(RadixCacheError, match="prefill_chunk must be a positive int"):
        CacheReplay(token_workload([]), 10, "lru", prefill_chunk=chunk)  # type: ignore[arg-type]


def test_the_cache_is_sound_after_chunked_commits_under_pressure(tmp_path: Path) -> None:
    """check=True runs the tree's invariant check after every request: the pages inserted a pass at a time, with the
    match locked, and the decode's pages, never break the cache's accounting at a capacity that evicts."""
    path = tmp_path / "r.jsonl"
    lines = [  # each shares a prefix of 40 - (i % 4) pages with the others, and adds a decode page of its own
        HashRequest(
            10.0 * i,
            40 * 16 - 3,
            19,  # 655 tokens written (not the last generated): 40 whole pages, then a partial one held while it ran
            (*range(40 - i % 4), *range(100 * i, 100 * i + i % 4)),
            16,
            output_hash_ids=(5000 + i,),
            finish_timestamp_ms=10.0 * i + 5,
        )
        for i in range(12)
    ]
    write_mooncake(path, lines)
    result = simulate(load_workload(path), 60, "reuse", prefill_chunk=128, check=True)
    assert result.requests == 12 and result.evicted_blocks > 0
