"""The optional fields of a recorded Mooncake trace (`--record-trace`): `block_size` on every line (all agreeing),
`output_hash_ids` replayed as the engine ran the request, `session_id` carried along; old traces are unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from radixcache.errors import RadixCacheError
from radixcache.sim.evaluation import evaluate
from radixcache.sim.simulation import simulate
from radixcache.sim.source import open_source
from radixcache.sim.tiers import TierConfig
from radixcache.trace import DEFAULT_BLOCK_SIZE, HashRequest, TraceError, iter_mooncake, read_trace, write_mooncake
from radixcache.trace.workload import SimRequest, hash_workload, load_workload


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _line(ts: float, length: int, ids: list[int], out: list[int] | None = None, **extra: object) -> dict:
    row: dict = {"timestamp": ts, "input_length": length, "output_length": 3, "hash_ids": ids, **extra}
    if out is not None:
        row["output_hash_ids"] = out
    return row


def _replayed(r: SimRequest) -> tuple:
    """What the replay reads of a request's pages and tokens (as tuples: a streamed trace reads int64 arrays)."""
    return (r.timestamp_ms, tuple(r.prompt), tuple(r.output), r.prompt_tokens, r.unit, r.namespace, r.session)


def test_the_optional_fields_are_read_and_written_back(tmp_path: Path) -> None:
    row = _line(0, 6, [11, 12], [13], block_size=4, session_id="u1", finish_timestamp=7.5)
    path = _write(tmp_path / "r.jsonl", [row])
    (request,) = read_trace(path).records
    assert request == HashRequest(
        0, 6, 3, (11, 12), block_size=4, output_hash_ids=(13,), session_id="u1", finish_timestamp_ms=7.5
    )
    assert [r.finish_ms for r in open_source(path)] == [7.5]
    write_mooncake(tmp_path / "copy.jsonl", [request])
    assert json.loads((tmp_path / "copy.jsonl").read_text()) == json.loads(path.read_text())


def test_an_old_trace_is_replayed_exactly_as_before(tmp_path: Path) -> None:
    rows = [_line(0, 1000, [0, 1]), _line(5, 1100, [0, 1, 2]), _line(9, 512, [0])]
    path = _write(tmp_path / "old.jsonl", rows)
    old_style = [(r["timestamp"], tuple(r["hash_ids"]), (), r["input_length"], 512, None, None) for r in rows]
    assert [_replayed(r) for r in load_workload(str(path))] == old_style
    assert [_replayed(r) for r in open_source(path)] == old_style
    assert open_source(path).block_tokens == DEFAULT_BLOCK_SIZE
    assert simulate(load_workload(str(path)), 8).hit_tokens == 1024 + 512  # the leading blocks seen before


def test_output_pages_follow_the_prompts_whole_pages_and_the_lookup_covers_them(tmp_path: Path) -> None:
    # 10 tokens at 4 per page: pages [a b c'] (c' partial); the engine looks up 2 whole pages and its tree gets a,
    # b, then the output pages. 8 tokens: the lookup covers both whole pages (the engine keeps a cached last page
    # but for its last position, which it computes again for the logits); the tree gets a, b.
    rows = [
        _line(0, 10, [1, 2, 3], [4], block_size=4, session_id="s"),
        _line(1, 8, [1, 2], [5, 6], block_size=4, output_length=9),  # 8 + 9 tokens: at most 2 pages past 8
    ]
    path = _write(tmp_path / "r.jsonl", rows)
    first, second = load_workload(str(path))
    assert (first.prompt, first.output, first.unit, first.session) == ((1, 2), (4,), 4, "s")
    assert (second.prompt, second.output) == ((1, 2), (5, 6))
    assert list(open_source(path)) == [first, second]


def test_a_recorded_conversation_hits_what_the_engine_would_have(tmp_path: Path) -> None:
    """Turn 2's prompt holds turn 1's prompt and reply: it hits turn 1's whole prompt pages and its output page, up
    to the whole pages of its prompt less the last token (counted by hand)."""
    rows = [
        _line(0, 10, [1, 2, 3], [4], block_size=4),  # the tree gets 1 2 4 (12 tokens)
        _line(7, 17, [1, 2, 4, 5, 6], [7], block_size=4),  # looks up 16 tokens: 1 2 4 5 -> hits 1 2 4 = 12
        _line(9, 13, [1, 2, 4, 8], [], block_size=4),  # looks up 12 tokens: 1 2 4 -> hits 12
    ]
    path = _write(tmp_path / "r.jsonl", rows)
    result = simulate(open_source(path), 64)
    assert (result.hit_tokens, result.prompt_tokens) == (24, 40)
    assert simulate(load_workload(str(path)), 64).hit_tokens == 24


def test_the_lines_block_size_wins_over_the_default_and_must_agree_with_another_asked_for(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.jsonl", [_line(0, 6, [1, 2], [], block_size=4)])
    assert open_source(path).block_tokens == 4
    assert load_workload(str(path)).block_tokens == 4
    assert open_source(path, block_size=4).block_tokens == 4
    with pytest.raises(TraceError, match=r"r\.jsonl:1: the trace's lines give block_size 4, not the 16 asked for"):
        open_source(path, block_size=16)
    with pytest.raises(TraceError, match=r"r\.jsonl:1: field 'block_size': the trace's lines give block_size 4"):
        list(iter_mooncake(path, block_size=16))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [_line(0, 6, [1, 2], [], block_size=4), _line(1, 6, [1, 3], [], block_size=8)],
            r"r\.jsonl:2: field 'block_size': 8 differs from the first line's 4",
        ),
        (
            [_line(0, 6, [1, 2], [], block_size=4), _line(1, 6, [1, 3], [])],
            r"r\.jsonl:2: field 'block_size': missing: the first line gives 4, so every line must",
        ),
        (
            [_line(0, 600, [1, 2]), _line(1, 6, [1, 3], [], block_size=4)],
            r"r\.jsonl:2: field 'block_size': given as 4, but the first line gives none",
        ),
        ([_line(0, 6, [1, 2], [], block_size=0)], r"r\.jsonl:1: field 'block_size': must be >= 1"),
        ([_line(0, 6, [1, 2], [], block_size="4")], r"r\.jsonl:1: field 'block_size': expected a non-negative"),
        ([_line(0, 6, [1, 2, 3], [], block_size=4)], r"r\.jsonl:1: field 'hash_ids': 3 hash ids, but input_length 6"),
        ([_line(0, 6, [1, 2], [-1], block_size=4)], r"r\.jsonl:1: field 'output_hash_ids': item 0 is -1"),
        ([_line(0, 6, [1, 2], [], block_size=4, session_id=7)], r"r\.jsonl:1: field 'session_id': expected a string"),
        (
            [_line(0, 6, [1, 2], [], block_size=4), _line(9, 6, [1, 2], [], block_size=4, finish_timestamp=8)],
            r"r\.jsonl:2: field 'finish_timestamp': 8 is earlier than the request's timestamp 9",
        ),
        (
            [_line(0, 6, [1, 2], [], block_size=4, finish_timestamp="soon")],
            r"r\.jsonl:1: field 'finish_timestamp': expected a number",
        ),
    ],
)
def test_bad_optional_fields_name_the_line_in_every_reader(tmp_path: Path, rows: list[dict], message: str) -> None:
    path = _write(tmp_path / "r.jsonl", rows)
    with pytest.raises(TraceError, match=message):
        list(open_source(path))
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_hash_workload_checks_that_requests_agree_on_their_block_size() -> None:
    a = HashRequest(0, 6, 1, (1, 2), block_size=4, output_hash_ids=())
    b = HashRequest(1, 6, 1, (1, 3), block_size=2, output_hash_ids=())
    with pytest.raises(RadixCacheError, match="request 1: block_size 2 differs from request 0's 4"):
        hash_workload([a, b])
    assert hash_workload([a]).block_tokens == 4


def test_streamed_and_in_memory_replays_agree_on_a_recorded_trace_with_the_infinite_bound(tmp_path: Path) -> None:
    rows = [
        _line(t, 9 + 4 * t, [100 + i for i in range(-(-(9 + 4 * t) // 4))], [7 + t], block_size=4) for t in range(6)
    ]
    path = _write(tmp_path / "r.jsonl", rows)
    streamed = evaluate(open_source(path), 3, "lru")
    in_memory = evaluate(load_workload(str(path)), 3, "lru")
    assert replace(streamed.result, seconds=0) == replace(in_memory.result, seconds=0)
    assert streamed.infinite is not None and streamed.infinite.hit_tokens == in_memory.infinite.hit_tokens


def test_more_output_pages_than_the_lengths_hold_are_refused_at_their_line(tmp_path: Path) -> None:
    """A line with 1,000 output_hash_ids for 1 output token was replayed as is: 1,000 pages entered the tree, the
    next turns hit them and `trace stats` counted them as unique blocks. The engine records one id per whole page it
    computed past the prompt's whole pages, which input_length + output_length bound: past that, the line is refused
    at its file:line, streamed or read in memory; at the bound it reads."""
    # 10 prompt tokens at 4 a page (2 whole pages) and 7 output tokens: 17 tokens, at most 4 - 2 = 2 pages past them.
    fits = _write(tmp_path / "fits.jsonl", [_line(0, 10, [1, 2, 3], [4, 5], block_size=4, output_length=7)])
    assert [r.output for r in load_workload(str(fits)).requests] == [(4, 5)]
    rows = [_line(0, 8, [1, 2], [], block_size=4), _line(1, 10, [1, 2, 3], [4, 5, 6], block_size=4, output_length=7)]
    path = _write(tmp_path / "r.jsonl", rows)
    message = f"{path}:2: field 'output_hash_ids': 3 ids, but input_length 10 and output_length 7 at block size 4"
    for read in (lambda: list(open_source(path)), lambda: load_workload(str(path)), lambda: read_trace(str(path))):
        with pytest.raises(TraceError, match=message):
            read()
    too_many = HashRequest(0, 10, 7, (1, 2, 3), 4, (4, 5, 6))
    with pytest.raises(RadixCacheError, match="request 0: output_hash_ids: 3 ids"):
        hash_workload([too_many], 4)


@pytest.mark.parametrize("host", [None, 1], ids=["device", "host-tier"])
@pytest.mark.parametrize(("generated", "hit"), [(1, 8), (2, 4)])
def test_a_recorded_request_holds_a_partial_page_only_when_the_engine_wrote_one(
    tmp_path: Path, host: int | None, generated: int, hit: int
) -> None:
    """A pool of 4 pages at 4 tokens a page; A and B each have 8 prompt tokens on 2 pages, then C asks for A's again.
    The engine writes every token but the last it generates: with 1 generated, A and B wrote 8 tokens, 2 whole
    pages and none partial, so both fit and C hits A's 8; with 2, B also held a page for its 9th token, which
    evicted A's last page, and C hits 4 (its own evicts one more; counted by hand)."""
    rows = [
        _line(0, 8, [1, 2], [], block_size=4, output_length=generated, finish_timestamp=0.5),
        _line(1, 8, [3, 4], [], block_size=4, output_length=generated, finish_timestamp=1.5),
        _line(2, 8, [1, 2], [], block_size=4, output_length=generated, finish_timestamp=2.5),
    ]
    path = _write(tmp_path / "r.jsonl", rows)
    tiers = None if host is None else TierConfig(host)
    result = simulate(open_source(path), 4, tiers=tiers, check=True)
    device_hit = result.hit_tokens if tiers is None else result.tiers.hit_tokens["device"]
    assert device_hit == hit
    assert result.evicted_blocks == (0 if hit == 8 else 2)  # with B's and then C's partial page
