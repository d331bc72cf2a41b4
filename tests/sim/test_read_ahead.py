"""A streamed trace read by a second process (radixcache.sim.read_ahead) gives the same requests, the same
figures and the same errors at the same file:line as reading it in the replay's own process; a replay that stops
early leaves no reader behind."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main as cli
from radixcache.sim.evaluation import evaluate
from radixcache.sim.packing import RequestPacker, unpack_requests
from radixcache.sim.read_ahead import read_ahead
from radixcache.sim.simulation import infinite_capacity, simulate
from radixcache.sim.source import open_source
from radixcache.trace.errors import TraceError
from radixcache.trace.synthetic import multi_turn_chat
from radixcache.trace.token_trace import write_token_jsonl
from radixcache.trace.workload import load_workload

from .conftest import MOONCAKE_TRACE

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a reader process is forked on Linux")
FIELDS = ("requests", "prompt_tokens", "hit_tokens", "prompt_blocks", "hit_blocks", "evicted_blocks", "windows")


def figures(result) -> list:
    return [getattr(result, f) for f in FIELDS]


def chat_trace(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    requests = sorted(multi_turn_chat(conversations=30, system_tokens=60, seed=5), key=lambda r: r.timestamp_ms)
    write_token_jsonl(path, requests)
    return path


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="shared Mooncake trace not found (../shared/traces)")
def test_read_ahead_gives_the_figures_of_reading_here_on_the_shared_mooncake_trace() -> None:
    here = open_source(str(MOONCAKE_TRACE))
    ahead = open_source(str(MOONCAKE_TRACE), read_ahead=True)
    assert list(read_ahead(here, batch=7)) == list(here)
    for policy in ("lru", "belady"):
        assert figures(simulate(ahead, 4000, policy)) == figures(simulate(here, 4000, policy))
    a, b = evaluate(ahead, 3000, "slru", concurrency=3), evaluate(here, 3000, "slru", concurrency=3)
    assert figures(a.result) == figures(b.result) and figures(a.infinite) == figures(b.infinite)


def test_read_ahead_gives_the_figures_of_reading_here_on_a_generated_token_trace(tmp_path: Path) -> None:
    path = chat_trace(tmp_path)
    here, ahead = open_source(str(path), page_size=4), open_source(str(path), page_size=4, read_ahead=True)
    assert list(read_ahead(here, batch=5)) == list(here)
    for policy in ("lru", "lfu", "belady"):
        assert figures(simulate(ahead, 50, policy)) == figures(simulate(here, 50, policy))


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        (b'{"timestamp": 1, "tokens": [1, -2], "output_length": 0}', r"t\.jsonl:41: field 'tokens': item 1 is -2"),
        (b'{"timestamp": 0, "tokens": [1], "output_length": 0}', r"t\.jsonl:41: .*earlier than the previous"),
        (b"{not json", r"t\.jsonl:41: invalid JSON"),
    ],
)
@pytest.mark.parametrize("packed", [False, True])
def test_an_error_arrives_after_every_request_before_it(
    tmp_path: Path, bad_line: bytes, message: str, packed: bool
) -> None:
    path = tmp_path / "t.jsonl"
    good = [b'{"timestamp": %d, "tokens": [1, 2, %d], "output_length": 1}' % (i + 1, i) for i in range(40)]
    path.write_bytes(b"\n".join([*good, bad_line, *good]) + b"\n")
    source = open_source(str(path))
    hooks = {"pack": RequestPacker, "unpack": unpack_requests} if packed else {}
    got = []
    with pytest.raises(TraceError, match=message) as ahead:
        for request in read_ahead(source, batch=6, **hooks):  # the error falls inside a batch
            got.append(request)
    with pytest.raises(TraceError) as here:
        list(source)
    assert str(ahead.value) == str(here.value)
    assert (ahead.value.path, ahead.value.where, ahead.value.field) == (here.value.path, "41", here.value.field)
    assert len(got) == 40 and got == list(source_prefix(source, 40))
    assert not multiprocessing.active_children()


def source_prefix(source, n: int) -> list:
    out = []
    for request in source:
        out.append(request)
        if len(out) == n:
            return out
    return out


def test_a_replay_that_stops_early_leaves_no_reader(tmp_path: Path) -> None:
    path = chat_trace(tmp_path)
    requests = read_ahead(open_source(str(path)), batch=2)
    first = [next(requests) for _ in range(3)]
    [reader] = multiprocessing.active_children()
    assert len(first) == 3
    requests.close()
    assert not multiprocessing.active_children()
    assert reader.exitcode == 0  # it saw the closed pipe and ended, not killed after a wait (exit code -9)


def test_the_cli_reads_ahead_on_request_with_the_same_report(tmp_path: Path) -> None:
    path = chat_trace(tmp_path)
    reports = []
    for flag in ("--read-ahead", "--no-read-ahead"):
        result = CliRunner().invoke(cli, ["simulate", str(path), "--capacity-blocks", "80", "--belady", "--json", flag])
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        report.pop("seconds")
        reports.append(report)
    assert reports[0] == reports[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().replace('"output_length": ', '"output_length": -', 1))
    result = CliRunner().invoke(cli, ["simulate", str(bad), "--capacity-blocks", "80", "--read-ahead"])
    assert result.exit_code == 1 and "bad.jsonl:1: field 'output_length'" in result.output


def test_reading_ahead_is_worth_it_for_large_traces_on_two_cores(tmp_path: Path, monkeypatch) -> None:
    import radixcache.sim.source as simulate_source

    hashes = tmp_path / "h.jsonl"
    hashes.write_text('{"timestamp": 0, "input_length": 16, "hash_ids": [1]}\n' * 200)
    tokens = chat_trace(tmp_path)
    monkeypatch.setattr(simulate_source, "READ_AHEAD_MIN_BYTES", 1000)
    monkeypatch.setattr(simulate_source.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert simulate_source.worth_reading_ahead(open_source(str(hashes), block_size=16))
    assert simulate_source.worth_reading_ahead(open_source(str(tokens)))  # token ids cross packed
    monkeypatch.setattr(simulate_source, "READ_AHEAD_MIN_BYTES", hashes.stat().st_size + 1)
    assert not simulate_source.worth_reading_ahead(open_source(str(hashes), block_size=16))  # too small
    monkeypatch.setattr(simulate_source, "READ_AHEAD_MIN_BYTES", 1000)
    monkeypatch.setattr(simulate_source.os, "cpu_count", lambda: 64)  # the host's; this process may run on one:
    monkeypatch.setattr(simulate_source.os, "sched_getaffinity", lambda pid: {0}, raising=False)  # (taskset -c 0)
    assert not simulate_source.worth_reading_ahead(open_source(str(hashes), block_size=16))  # no second core
    # `simulate --help` says the same default (it said hash traces only, after token traces were read ahead too)
    shown = " ".join(CliRunner().invoke(cli, ["simulate", "--help"], terminal_width=200).output.split())
    assert "[default: on for hash or token traces of 8 MiB or more on a machine with two cores or more]" in shown


def test_the_infinite_bound_replayed_by_the_reader_equals_a_cache_that_never_evicts(tmp_path: Path) -> None:
    """evaluate() runs the infinite-cache bound in the reader process: chained ids, and ids that follow two
    parents (the bound is replayed again by sequence), give a tree that never evicts its figures."""
    chained = tmp_path / "chained.jsonl"
    reused = tmp_path / "reused.jsonl"
    line = '{{"timestamp": {}, "input_length": {}, "output_length": 1, "hash_ids": {}}}\n'
    chained.write_text("".join(line.format(t, 16 * len(ids), ids) for t, ids in enumerate([[1, 2], [1, 2, 3], [4]])))
    rows = [[1, 2], [3, 2], [3, 2, 5], [2], [2, 2], [2, 2, 7], [1, 2, 9]]  # id 2 after 1, after 3, after root...
    reused.write_text("".join(line.format(t, 16 * len(ids), ids) for t, ids in enumerate(rows)))
    for path in (chained, reused):
        memory = load_workload(str(path), block_size=16)
        tree = simulate(memory, infinite_capacity(memory))
        for concurrency in (1, 2):
            ahead = evaluate(open_source(str(path), block_size=16, read_ahead=True), 2, concurrency=concurrency)
            here = evaluate(open_source(str(path), block_size=16), 2, concurrency=concurrency)
            assert figures(ahead.infinite) == figures(here.infinite)
            assert figures(ahead.result) == figures(here.result)
            if concurrency == 1:
                assert figures(ahead.infinite) == figures(tree)
        assert not multiprocessing.active_children()


def test_bounds_replayed_in_parallel_give_the_figures_of_replaying_them_here(tmp_path: Path) -> None:
    path = chat_trace(tmp_path)
    source = open_source(str(path), page_size=4)
    seen: list[int] = []
    for concurrency in (1, 2):
        kwargs = {"concurrency": concurrency, "belady": True, "belady_admission": True}
        parallel = evaluate(source, 50, "lru", parallel=True, progress=seen.append, **kwargs)
        here = evaluate(source, 50, "lru", **kwargs)
        for a, b in ((parallel.result, here.result), (parallel.belady, here.belady)):
            assert figures(a) == figures(b)
        assert figures(parallel.belady_admission) == figures(here.belady_admission)
        assert figures(parallel.infinite) == figures(here.infinite)
    assert sum(seen) == 2 * 3 * here.result.requests  # every replay's requests reach the progress bar
    assert not multiprocessing.active_children()


def test_a_bound_that_fails_in_its_process_fails_the_evaluation(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1, "tokens": [1, 2], "output_length": 0}\n{"timestamp": 2, "tokens": [-1]}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:2: field 'tokens'"):
        evaluate(open_source(str(path)), 4, belady=True, parallel=True)
    assert not multiprocessing.active_children()


def _evaluate_in_a_worker(path: str) -> list:
    report = evaluate(open_source(path, page_size=4, read_ahead=True), 50, belady=True, parallel=True)
    return [figures(report.result), figures(report.infinite), figures(report.belady)]


def test_a_pool_worker_which_may_not_fork_reads_and_replays_in_place(tmp_path: Path) -> None:
    """A daemonic process (a pool's worker) may not have children: the same figures, with no child."""
    path = chat_trace(tmp_path)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply(_evaluate_in_a_worker, (str(path),))
    report = evaluate(open_source(str(path), page_size=4), 50, belady=True)
    assert got == [figures(report.result), figures(report.infinite), figures(report.belady)]


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_a_read_ahead_that_is_no_bool_is_refused(flag: object, tmp_path: Path) -> None:
    """read_ahead="no" (truthy) started a reader process for every pass, silently."""
    from radixcache.errors import RadixCacheError

    path = str(chat_trace(tmp_path))  # not the shared trace: a clone of the project alone has none beside it
    with pytest.raises(RadixCacheError, match=f"read_ahead must be True or False, got {flag!r}"):
        open_source(path, read_ahead=flag)  # type: ignore[arg-type]
    assert open_source(path, read_ahead=False).read_ahead is False
