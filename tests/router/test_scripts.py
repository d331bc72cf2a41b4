"""scripts/simulate_routing.py (the sweep, here, on processes and on Ray), scripts/bench_router_index.py, and
scripts/simulate_eviction.py's --ray on a real local Ray."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.trace import write_token_jsonl
from radixcache.trace.records import TokenRequest
from tests.refusals import assert_refused

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
one_ray_at_a_time = pytest.mark.xdist_group("ray")  # under pytest-xdist, every Ray test runs on one worker


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".py", "_script"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def tiny_chat(tmp_path: Path, name: str = "tiny", shared: int = 3) -> Path:
    """Sessions that grow their prompt turn by turn over a few shared prefixes."""
    trace = tmp_path / f"{name}.jsonl"
    requests = []
    for i in range(48):
        conv, turn = i % 12, i // 12
        prompt = tuple([conv % shared] * 8 + [100 + conv] * (8 * (turn + 1)))
        requests.append(TokenRequest(i * 100, prompt, 4, f"s{conv}", output_tokens=(7, 7, 7, 7)))
    write_token_jsonl(trace, requests)
    return trace


def sweep(tmp_path: Path, traces: list[str], *extra: str) -> tuple[list[dict], str]:
    out = tmp_path / f"out{len(extra)}{'-'.join(extra)}"
    args = [*traces, "--replicas", "2,4", "--router", "round_robin", "--router", "cache_aware", "--page-size", "4"]
    args += ["--capacity-blocks", "40", "--rate-per-replica", "2", "--out", str(out), *extra]
    result = CliRunner().invoke(load_script("simulate_routing.py").main, args)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "routing.csv").read_text().splitlines()))
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows], result.stderr


def test_the_sweep_writes_csv_markdown_and_plot(tmp_path: Path) -> None:
    rows, err = sweep(tmp_path, [str(tiny_chat(tmp_path))], "--workers", "1")
    assert "4 routed replays on 1 worker (this process)" in err
    assert [(r["router"], r["replicas"]) for r in rows] == [
        ("round_robin", "2"),
        ("cache_aware", "2"),
        ("round_robin", "4"),
        ("cache_aware", "4"),
    ]
    assert rows[-1]["rate"] == "8.0"  # 2 per replica, 4 replicas
    out = next(tmp_path.glob("out*"))
    assert "| replicas |" in (out / "routing.md").read_text()
    assert (out / "routing.png").stat().st_size > 1000


def test_a_parallel_sweep_gives_the_sequential_rows(tmp_path: Path) -> None:
    traces = [str(tiny_chat(tmp_path)), str(tiny_chat(tmp_path, "other", shared=5))]
    sequential, _ = sweep(tmp_path, traces, "--workers", "1", "--no-plot")
    parallel, err = sweep(tmp_path, traces, "--workers", "2", "--no-plot")
    assert "on 2 worker processes" in err
    assert parallel == sequential and len(sequential) == 8


def test_two_traces_of_one_name_keep_their_own_rows(tmp_path: Path) -> None:
    """Regression: day1/tiny.jsonl and day2/tiny.jsonl were both named 'tiny', and the table showed one of them
    (each row of the other overwritten); each keeps its name (its path) and the rows it gets swept alone."""
    traces = []
    for day, shared in (("day1", 3), ("day2", 12)):
        (tmp_path / day).mkdir()
        traces.append(str(tiny_chat(tmp_path / day, shared=shared)))
    both, _ = sweep(tmp_path, traces, "--workers", "1", "--no-plot")
    alone = [row for trace in traces for row in sweep(tmp_path / Path(trace).parent.name, [trace], "--no-plot")[0]]
    assert [row["trace"] for row in both] == [trace for trace in traces for _ in range(4)]

    def figures(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "trace"} for row in rows]

    assert figures(both) == figures(alone) and figures(both[:4]) != figures(both[4:])
    table = (next(tmp_path.glob("out*")) / "routing.md").read_text()
    assert all(f"**{trace}**" in table for trace in traces)
    twice = CliRunner().invoke(
        load_script("simulate_routing.py").main, [traces[0], traces[0], "--capacity-blocks", "9"]
    )
    assert_refused(twice, f"{traces[0]} is given twice")


def test_the_sweep_refuses_bad_input(tmp_path: Path) -> None:
    main = load_script("simulate_routing.py").main
    base = ["--capacity-blocks", "10", "--out", str(tmp_path)]
    assert_refused(CliRunner().invoke(main, ["synthetic:nope", *base]), "synthetic:nope: choose one of")
    assert_refused(CliRunner().invoke(main, [str(tmp_path / "missing.jsonl"), *base]), "no such trace file")
    two = ["synthetic:chat", "synthetic:agent", "--out", str(tmp_path)]
    three = CliRunner().invoke(main, [*two, "--capacity-blocks", "1,2,3"])
    assert_refused(three, "--capacity-blocks: give one value, or one per trace (2), not 3")
    zero = CliRunner().invoke(main, [*two, "--capacity-blocks", "10", "--rate-per-replica", "0"])
    assert_refused(zero, "--rate-per-replica: every value must be a finite number > 0")


@pytest.mark.parametrize("replicas", ["0", "2,4097"])
def test_the_sweep_refuses_a_replica_count_the_simulator_does_not_hold(tmp_path: Path, replicas: str) -> None:
    """Regression: a count past the simulator's 4,096 replicas ran the smaller counts' cells, then failed with a
    RadixCacheError traceback; it is refused before any replay, as 0 is."""
    main = load_script("simulate_routing.py").main
    args = ["synthetic:chat", "--replicas", replicas, "--capacity-blocks", "10", "--router", "round_robin"]
    result = CliRunner().invoke(main, [*args, "--workers", "1", "--out", str(tmp_path / "out")])
    assert_refused(result, "--replicas: give replica counts in [1, 4,096]")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ("nan", "--rate-per-replica: every value must be a finite number > 0"),
        ("inf", "--rate-per-replica: every value must be a finite number > 0"),
        ("1e-320", "--rate-per-replica: a cluster rate of 2e-320 requests/s has no finite arrival gap"),
        ("1e308", "--rate-per-replica: a cluster rate of inf requests/s has no finite arrival gap"),
    ],
)
def test_the_sweep_refuses_a_rate_with_no_finite_arrival_gap(tmp_path: Path, rate: str, message: str) -> None:
    """Regression: NaN passed `v <= 0`, and NaN, inf, a subnormal rate or one whose cluster rate (x 2 replicas)
    overflows each failed the replay with a RadixCacheError traceback; each is refused before any replay now."""
    main = load_script("simulate_routing.py").main
    args = ["synthetic:chat", "--replicas", "2", "--capacity-blocks", "10", "--rate-per-replica", rate]
    result = CliRunner().invoke(main, [*args, "--workers", "1", "--out", str(tmp_path / "out")])
    assert_refused(result, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_cell_that_fails_in_its_replay_is_an_error_naming_it(tmp_path: Path, workers: str) -> None:
    """Regression: a cell's error raised in its replay (an empty trace file, a rate whose arrivals sum past the
    largest double) was a RadixCacheError traceback, exit 1, here or from a worker process; it is one line naming
    the file:line or the request, and no table is written. (Before the arrivals were checked, the rate's cells ran
    with NaN TTFTs, and the plot failed with matplotlib's ValueError traceback.)"""
    main = load_script("simulate_routing.py").main
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    base = ["--replicas", "1,2", "--router", "round_robin", "--capacity-blocks", "10", "--workers", workers]
    result = CliRunner().invoke(main, [str(empty), *base, "--out", str(tmp_path / "a")])
    assert_refused(result, f"{empty}:1: empty file")
    args = [str(tiny_chat(tmp_path)), *base, "--rate-per-replica", "1e-307", "--out", str(tmp_path / "b")]
    assert_refused(CliRunner().invoke(main, args), "is too small for this trace: request 0 would arrive")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_index_benchmark_measures_memory_throughput_and_routes() -> None:
    out = load_script("bench_router_index.py").bench(replicas=4, pages=200, batch=8, rate=10_000, seconds=0.1)
    assert out["index_pages"] == 800 and out["stream_events"] == (1000 // 16) * 16  # whole batches of 8 + 8
    assert out["apply_events_per_s"] > 0 and out["index_bytes_per_page"] > 16 and out["route_us"] > 0


@pytest.mark.slow
@needs_ray
@one_ray_at_a_time
def test_the_sweep_on_a_local_ray_gives_the_sequential_rows(tmp_path: Path) -> None:
    traces = [str(tiny_chat(tmp_path))]
    sequential, _ = sweep(tmp_path, traces, "--workers", "1", "--no-plot")
    on_ray, err = sweep(tmp_path, traces, "--ray", "--ray-cpus", "1", "--workers", "1", "--no-plot")
    assert "on 1 Ray actors" in err
    assert on_ray == sequential


@pytest.mark.slow
@needs_ray
@one_ray_at_a_time
def test_the_eviction_sweep_on_a_local_ray(tmp_path: Path) -> None:
    trace = tmp_path / "tiny.jsonl"
    write_token_jsonl(trace, [TokenRequest(i, (i % 3, 1, 2, 3, 4, 5, 6, 7), 0) for i in range(40)])
    args = [str(trace), "--policy", "lru", "--fractions", "0.5", "--page-size", "2", "--no-plot"]
    result = CliRunner().invoke(
        load_script("simulate_eviction.py").main, [*args, "--ray", "--workers", "1", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 0, result.output
    assert "on 1 Ray actors" in result.stderr
    rows = list(csv.DictReader((tmp_path / "o" / "sweep.csv").read_text().splitlines()))
    assert {r["policy"] for r in rows} == {"lru", "belady", "belady-admission", "infinite"}


@pytest.mark.parametrize("flag", ["--prefill-ms-per-token", "--decode-ms-per-token"])
@pytest.mark.parametrize("cost", ["1e308", "1e10"])
def test_the_sweep_refuses_a_cost_past_max_cost_ms(tmp_path: Path, flag: str, cost: str) -> None:
    """Regression: 1e308 ms a token made every modelled time inf (each replica's load alike); past MAX_COST_MS (1e9)
    a cost is refused by its flag, as simulate's are."""
    main = load_script("simulate_routing.py").main
    args = ["synthetic:chat", "--replicas", "2", "--capacity-blocks", "10", flag, cost]
    result = CliRunner().invoke(main, [*args, "--workers", "1", "--out", str(tmp_path / "out")])
    assert_refused(result, flag)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("rate", "seconds"), [("nan", "1"), ("1000", "inf"), ("1e300", "1")])
def test_the_index_benchmark_refuses_a_stream_it_cannot_make(rate: str, seconds: str) -> None:
    """Regression: NaN and inf were int()'s ValueError or OverflowError after the fill, 1e300 events/s a stream made
    whole until memory ran out."""
    main = load_script("bench_router_index.py").main
    result = CliRunner().invoke(
        main, ["--replicas", "2", "--pages-per-replica", "32", "--rate", rate, "--seconds", seconds]
    )
    assert_refused(result, "--rate x --seconds must be finite")


def test_the_default_workers_are_the_cpus_this_process_may_run_on(tmp_path: Path, monkeypatch) -> None:
    """Under `taskset -c 0` on a 64-core host the sweep started 4 worker processes (one per cell, `os.cpu_count()`)
    on one CPU."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    _, err = sweep(tmp_path, [str(tiny_chat(tmp_path))], "--no-plot")
    assert "4 routed replays on 1 worker (this process)" in err
