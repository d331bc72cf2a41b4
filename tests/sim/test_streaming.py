"""The streamed replay (simulate_source.TraceSource, one request in memory at a time) gives exactly the figures of
the in-memory replay, on the shared Mooncake trace and on a generated token trace; the compact infinite-cache
replay equals a RadixCache that never evicts; bad input names file:line without reading the rest of the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixcache.sim.evaluation import evaluate
from radixcache.sim.simulation import infinite_capacity, simulate, simulate_infinite
from radixcache.sim.source import open_source
from radixcache.trace.errors import TraceError
from radixcache.trace.synthetic import multi_turn_chat
from radixcache.trace.token_trace import write_token_jsonl, write_token_msgpack
from radixcache.trace.workload import load_workload

from .conftest import MOONCAKE_TRACE

FIELDS = ("requests", "prompt_tokens", "hit_tokens", "prompt_blocks", "hit_blocks", "evicted_blocks", "windows")


def same(a, b) -> None:
    assert [getattr(a, f) for f in FIELDS] == [getattr(b, f) for f in FIELDS]


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="shared Mooncake trace not found (../shared/traces)")
@pytest.mark.parametrize(
    ("policy", "capacity", "concurrency"), [("lru", 4000, 1), ("slru", 8000, 4), ("belady", 4000, 1)]
)
def test_streaming_equals_in_memory_on_the_shared_mooncake_trace(policy: str, capacity: int, concurrency: int) -> None:
    memory = load_workload(str(MOONCAKE_TRACE))
    stream = open_source(str(MOONCAKE_TRACE))
    same(
        simulate(stream, capacity, policy, concurrency=concurrency),
        simulate(memory, capacity, policy, concurrency=concurrency),
    )


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="shared Mooncake trace not found (../shared/traces)")
def test_the_compact_infinite_replay_equals_a_cache_that_never_evicts() -> None:
    memory = load_workload(str(MOONCAKE_TRACE))
    tree = simulate(memory, infinite_capacity(memory))
    for source in (memory, open_source(str(MOONCAKE_TRACE))):
        compact = simulate_infinite(source)
        same(compact, tree)
    assert compact.capacity_blocks == 43_924  # the trace's distinct blocks


@pytest.mark.parametrize("suffix", [".jsonl", ".msgpack"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_streaming_equals_in_memory_on_a_generated_token_trace(tmp_path: Path, suffix: str, page_size: int) -> None:
    path = tmp_path / f"chat{suffix}"
    requests = sorted(multi_turn_chat(conversations=30, system_tokens=60, seed=5), key=lambda r: r.timestamp_ms)
    (write_token_msgpack if suffix == ".msgpack" else write_token_jsonl)(path, requests)
    memory = load_workload(str(path), page_size=page_size)
    stream = open_source(str(path), page_size=page_size)
    capacity = 200 // page_size
    for policy in ("lru", "lfu", "belady"):
        same(simulate(stream, capacity, policy, concurrency=2), simulate(memory, capacity, policy, concurrency=2))
    same(simulate_infinite(stream, concurrency=3), simulate(memory, infinite_capacity(memory), concurrency=3))
    a, b = evaluate(stream, capacity, belady=True), evaluate(memory, capacity, belady=True)
    assert a.as_dict() | {"seconds": 0} == b.as_dict() | {"seconds": 0}


def _hash_line(t: float, ids: list[int]) -> str:
    return json.dumps({"timestamp": t, "input_length": len(ids) * 512, "output_length": 1, "hash_ids": ids}) + "\n"


def test_an_out_of_order_trace_is_refused_at_its_line_when_streamed_and_sorted_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "late.jsonl"
    path.write_text(_hash_line(10, [1, 2]) + _hash_line(30, [1, 3]) + _hash_line(20, [1, 2, 4]))
    with pytest.raises(TraceError, match=r"late\.jsonl:3: field 'timestamp': timestamp 20 is earlier"):
        simulate(open_source(str(path)), 10)
    assert simulate(load_workload(str(path)), 10).requests == 3


@pytest.mark.parametrize("read_ahead", [False, True])
def test_an_out_of_order_msgpack_record_is_named_with_its_byte(tmp_path: Path, read_ahead: bool) -> None:
    """Regression: the error named "record 1" alone, where every other error of a msgpack stream names the record
    and the byte it starts at (a stream has no lines to count by hand)."""
    from radixcache.trace.records import TokenRequest

    path = tmp_path / "t.msgpack"
    records = []
    for request in (TokenRequest(7.0, (1, 3), 1), TokenRequest(5.0, (1, 2), 1)):  # the writer takes either alone
        write_token_msgpack(path, [request])
        records.append(path.read_bytes())
    first = records[0]
    path.write_bytes(b"".join(records))  # record 0 at 7 ms, record 1 at 5 ms
    source = open_source(str(path), read_ahead=read_ahead)
    with pytest.raises(TraceError) as caught:
        list(source)
    assert str(caught.value).startswith(f"{path}: record 1 (byte {len(first)}): field 'timestamp': timestamp 5.0 is")


def test_a_bad_line_is_named_before_the_rest_of_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_hash_line(1, [1]) + '{"timestamp": 2, "input_length": 512, "hash_ids": [1, -3]}\n' + "{oops\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: field 'hash_ids': item 1 is -3"):
        simulate(open_source(str(path)), 10)
    path.write_text(_hash_line(1, [1]) + _hash_line(2, [1]).replace('"input_length": 512', '"input_length": 9999'))
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: field 'hash_ids': 1 hash ids, but input_length 9999"):
        simulate(open_source(str(path)), 10)
    path.write_bytes(_hash_line(1, [1]).encode() + b'{"timestamp": \xff}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: not UTF-8"):
        simulate(open_source(str(path)), 10)


def test_ids_that_are_not_chained_hashes_fall_back_to_chained_keys(tmp_path: Path) -> None:
    path = tmp_path / "reused.jsonl"
    rows = [[1, 2], [3, 2], [3, 2, 5], [2], [2, 2], [2, 2, 7], [1, 2, 9]]  # id 2 after 1, after 3, after root...
    path.write_text("".join(_hash_line(t, ids) for t, ids in enumerate(rows)))
    memory = load_workload(str(path))
    tree = simulate(memory, infinite_capacity(memory))
    for concurrency in (1, 2):
        same(
            simulate_infinite(open_source(str(path)), concurrency=concurrency),
            simulate(memory, infinite_capacity(memory), concurrency=concurrency),
        )
    assert tree.hit_blocks == 2 + 1 + 2 + 2  # [3,2,(5)] [2,(2)] [2,2,(7)] [1,2,(9)]
    report = evaluate(open_source(str(path)), 3)
    same(report.infinite, tree)


def _general_oracle_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.sim.oracle import ChainedNextUseOracle

    monkeypatch.setattr(ChainedNextUseOracle, "build", classmethod(lambda cls, workload, capacity: None))


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="shared Mooncake trace not found (../shared/traces)")
@pytest.mark.parametrize("policy", ["belady", "lru-dead"])
def test_the_flat_array_oracle_equals_the_trie_oracle_on_the_mooncake_trace(monkeypatch, policy: str) -> None:
    source = open_source(str(MOONCAKE_TRACE))
    flat = simulate(source, 3000, policy, concurrency=2)
    _general_oracle_only(monkeypatch)
    same(flat, simulate(source, 3000, policy, concurrency=2))


@pytest.mark.parametrize("seed", range(6))
def test_the_flat_array_oracle_equals_the_trie_oracle_on_random_chained_traces(monkeypatch, tmp_path, seed) -> None:
    import random

    rng = random.Random(seed)
    paths: list[list[int]] = [[]]
    next_id = 0
    lines = []
    for t in range(300):
        base = list(rng.choice(paths))[: rng.randint(0, 12)]
        extra = list(range(next_id, next_id + rng.randint(1, 5)))
        next_id += len(extra)
        paths.append(base + extra)
        lines.append(_hash_line(t, base + extra))
    path = tmp_path / "chained.jsonl"
    path.write_text("".join(lines))
    source = open_source(str(path))
    capacity = rng.randint(5, 60)
    flat = [simulate(source, capacity, p, concurrency=c) for p in ("belady", "lru-dead") for c in (1, 3)]
    _general_oracle_only(monkeypatch)
    for got, policy_concurrency in zip(flat, [(p, c) for p in ("belady", "lru-dead") for c in (1, 3)], strict=True):
        same(got, simulate(source, capacity, policy_concurrency[0], concurrency=policy_concurrency[1]))


def test_ids_too_large_for_the_parent_array_fall_back_to_chained_keys(tmp_path: Path) -> None:
    path = tmp_path / "large.jsonl"
    rows = [[1, 2**40], [1, 2**40, 7], [1, 2**40, 7, 2**62]]
    path.write_text("".join(_hash_line(t, ids) for t, ids in enumerate(rows)))
    memory = load_workload(str(path))
    same(simulate_infinite(open_source(str(path))), simulate(memory, infinite_capacity(memory)))
    assert simulate_infinite(open_source(str(path))).hit_blocks == 2 + 3


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="shared Mooncake trace not found (../shared/traces)")
def test_no_infinite_skips_only_the_bound(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from radixcache.cli.main import main

    runner = CliRunner()
    args = ["simulate", str(MOONCAKE_TRACE), "--capacity-blocks", "4000", "--json"]
    full = json.loads(runner.invoke(main, args).output)
    lean = json.loads(runner.invoke(main, [*args, "--no-infinite"]).output)
    assert "infinite_hit_rate" in full and "infinite_hit_rate" not in lean
    assert {k: v for k, v in full.items() if not k.startswith("infinite") and k != "seconds"} == {
        k: v for k, v in lean.items() if k != "seconds"
    }
