"""scripts/simulate_eviction.py writes its CSV, Markdown table and plot, and refuses unknown input."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main as cli
from radixcache.sim.sweep import CellRunner, SweepCell, SweepRow, load_trace, run_cell, run_cells_in_processes
from radixcache.trace import write_token_jsonl
from radixcache.trace.records import TokenRequest
from tests.refusals import assert_refused
from tests.sim.conftest import load_script, write_overlapping_recorded_trace


def tiny_trace(tmp_path: Path, name: str = "tiny", shared: int = 3) -> Path:
    trace = tmp_path / f"{name}.jsonl"
    write_token_jsonl(trace, [TokenRequest(i, (i % shared, 1, 2, 3, 4, 5, 6, 7), 0) for i in range(40)])
    return trace


def test_sweep_writes_csv_markdown_and_plot(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path)
    args = [str(trace), "--policy", "lru", "--policy", "reuse", "--fractions", "0.2,0.5", "--page-size", "2"]
    result = CliRunner().invoke(
        load_script("simulate_eviction").main, [*args, "--dead-bound", "--workers", "1", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    assert "11 replays on 1 worker (this process)" in result.stderr  # infinite, then 2 x (2 policies + 3 bounds)
    rows = list(csv.DictReader((tmp_path / "out" / "sweep.csv").read_text().splitlines()))
    assert {r["policy"] for r in rows} == {"lru", "reuse", "belady", "belady-admission", "lru-dead", "infinite"}
    assert len(rows) == 1 + 2 * 5
    table = (tmp_path / "out" / "sweep.md").read_text()
    assert "| capacity (blocks) |" in table and "belady" in table
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 1000


def test_sweep_refuses_unknown_policies_and_workloads(tmp_path: Path) -> None:
    main = load_script("simulate_eviction").main
    nope = CliRunner().invoke(main, ["synthetic:nope", "--out", str(tmp_path)])
    assert_refused(nope, "synthetic:nope: choose one of")
    unknown = CliRunner().invoke(main, ["synthetic:chat", "--policy", "nope", "--out", str(tmp_path)])
    assert_refused(unknown, "unknown policy 'nope'; choose from", "lru")
    assert not any(tmp_path.iterdir()), "a refused sweep writes nothing"


@pytest.mark.parametrize("fractions", ["nan", "0.1,inf", "-0.5", "0", ","])
def test_sweep_refuses_fractions_that_are_not_finite_and_positive(tmp_path: Path, fractions: str) -> None:
    """Regression: --fractions nan or inf was a ValueError or OverflowError traceback from round(), and a fraction
    <= 0 a 1-block cache labelled with its own share; "," swept no capacity at all. Each is a usage error now."""
    main = load_script("simulate_eviction").main
    result = CliRunner().invoke(
        main, [str(tiny_trace(tmp_path)), "--fractions", fractions, "--out", str(tmp_path / "o")]
    )
    assert_refused(result, f"--fractions {fractions!r}: expected finite numbers > 0")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("fraction", [float("nan"), float("inf"), -0.5, 0.0, True])
def test_capacities_for_refuses_a_fraction_that_is_not_finite_and_positive(fraction: float) -> None:
    from radixcache.errors import RadixCacheError
    from radixcache.sim.sweep import capacities_for
    from radixcache.trace.workload import token_workload

    workload = token_workload([TokenRequest(0, (1, 2, 3, 4), 0)], 1)
    assert capacities_for(workload, [0.5, 1e-9]) == [1, 2]
    with pytest.raises(RadixCacheError, match="a capacity fraction must be a finite number > 0"):
        capacities_for(workload, [0.5, fraction])


def sweep_rows(tmp_path: Path, traces: list[str], workers: int) -> list[dict]:
    out = tmp_path / f"out{workers}"
    args = [*traces, "--policy", "lru", "--policy", "reuse", "--fractions", "0.2,0.5", "--page-size", "2"]
    result = CliRunner().invoke(
        load_script("simulate_eviction").main, [*args, "--workers", str(workers), "--no-plot", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"on {workers} worker" in result.stderr
    rows = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_parallel_sweep_gives_the_sequential_rows_in_order(tmp_path: Path) -> None:
    traces = [str(tiny_trace(tmp_path)), str(tiny_trace(tmp_path, "other", shared=7))]
    sequential = sweep_rows(tmp_path, traces, 1)
    assert len(sequential) == 2 * (1 + 2 * 4)  # per trace: infinite, then 2 capacities x (2 policies + 2 bounds)
    assert sweep_rows(tmp_path, traces, 2) == sequential


def test_ray_without_ray_installed_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray is a dev dependency, so it is installed here: hide it the way Python sees an absent package (a None entry
    # in sys.modules makes find_spec answer None and `import ray` fail), for this test only.
    monkeypatch.setitem(sys.modules, "ray", None)
    assert importlib.util.find_spec("ray") is None
    result = CliRunner().invoke(
        load_script("simulate_eviction").main, ["synthetic:chat", "--ray", "--out", str(tmp_path / "out")]
    )
    assert_refused(result, "--ray needs Ray, which is not installed: pip install ray")
    assert not (tmp_path / "out").exists()


def bursty_trace(tmp_path: Path) -> Path:
    """Bursts of 20 requests a millisecond apart, 100 s between bursts: request counts and time disagree."""
    rng = random.Random(0)
    requests = []
    for i in range(400):
        tail = tuple(rng.randrange(50) for _ in range(rng.randrange(2, 12)))
        requests.append(TokenRequest((i // 20) * 100_000 + i % 20, (i % 7,) * 3 + tail, 0))
    trace = tmp_path / "bursty.jsonl"
    write_token_jsonl(trace, requests)
    return trace


def test_honor_timestamps_reaches_every_worker_and_changes_only_reuse(tmp_path: Path) -> None:
    trace = bursty_trace(tmp_path)
    workload = load_trace(str(trace), 1, 512)[1]
    cells = [SweepCell(0, "bursty", policy, 40, 0.1) for policy in ("reuse", "lru")]

    def figures(rows: Iterable[SweepRow]) -> list[tuple]:
        return [(r.policy, r.hit_tokens, r.evicted_blocks) for r in rows]

    ticks = figures(run_cell(cell, workload) for cell in cells)
    timed = figures(run_cell(cell, workload, honor_timestamps=True) for cell in cells)
    runner = CellRunner([str(trace)], 1, 512, honor_timestamps=True)
    assert figures(run_cells_in_processes(cells, runner, 2)) == timed  # the workers ran on the trace's clock
    assert timed[0] != ticks[0]  # reuse measures its waits in time: the bursts no longer read as long waits
    assert timed[1] == ticks[1]  # LRU's order is the same under either clock
    args = [str(trace), "--policy", "reuse", "--fractions", "0.2", "--page-size", "1", "--workers", "1"]
    result = CliRunner().invoke(
        load_script("simulate_eviction").main, [*args, "--honor-timestamps", "--no-plot", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output


def test_two_traces_of_one_name_get_a_table_each(tmp_path: Path) -> None:
    """Regression: day1/trace.jsonl and day2/trace.jsonl were both named 'trace', so the sweep printed one table
    mixing their rows (each capacity's cells overwriting the other's, one infinite bound for both). Each gets its
    own, the table it gets when swept alone."""
    main = load_script("simulate_eviction").main
    for day in ("day1", "day2"):
        (tmp_path / day).mkdir()
    traces = [tiny_trace(tmp_path / day, "trace", shared) for day, shared in (("day1", 3), ("day2", 40))]
    args = ["--policy", "lru", "--fractions", "0.3", "--page-size", "2", "--workers", "1", "--no-plot"]

    def tables(paths: list[Path], out: str) -> list[str]:
        result = CliRunner().invoke(main, [*map(str, paths), *args, "--out", str(tmp_path / out)])
        assert result.exit_code == 0, result.output
        # one table per trace: the lines under its title (which names it, and gives its infinite-cache hit rate)
        found: list[str] = []
        for line in (tmp_path / out / "sweep.md").read_text().splitlines():
            if "(infinite cache:" in line:
                found.append(line.split("(", 1)[1])
            elif found:
                found[-1] += "\n" + line
        return [table.strip() for table in found]

    both = tables(traces, "both")
    assert both == tables(traces[:1], "one") + tables(traces[1:], "two")
    assert both[0] != both[1]
    rows = list(csv.DictReader((tmp_path / "both" / "sweep.csv").read_text().splitlines()))
    assert {row["trace"] for row in rows} == {str(trace) for trace in traces}
    twice = CliRunner().invoke(main, [str(traces[0]), str(traces[0]), *args, "--out", str(tmp_path / "twice")])
    assert_refused(twice, f"{traces[0]} is given twice")


def test_a_sweep_without_lru_leaves_the_gap_columns_empty(tmp_path: Path) -> None:
    """Regression: without an lru column the gap to Belady was printed as 'nan pt'; it reads '-', as the share does."""
    args = [str(tiny_trace(tmp_path)), "--policy", "lfu", "--fractions", "0.3", "--workers", "1", "--no-plot"]
    result = CliRunner().invoke(load_script("simulate_eviction").main, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "out" / "sweep.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert "nan" not in table and row.endswith("| lfu | - | - |")


def test_policy_names_are_taken_in_any_case(tmp_path: Path) -> None:
    """Regression: --policy was case-sensitive in the sweep and in `radixcache simulate` ('LFU' refused), while
    --policies and make_policy take any case. Each gives what the lower-case name gives."""
    trace = tiny_trace(tmp_path)
    args = ["--fractions", "0.3", "--page-size", "2", "--workers", "1", "--no-plot"]
    sweep = load_script("simulate_eviction").main
    tables = []
    for name, spelled in (("lower", ["lfu"]), ("upper", ["LFU", "Lfu"])):
        policies = [arg for policy in spelled for arg in ("--policy", policy)]
        result = CliRunner().invoke(sweep, [str(trace), *policies, *args, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        tables.append((tmp_path / name / "sweep.md").read_text())
    assert tables[0] == tables[1]
    common = ["simulate", str(trace), "--capacity-blocks", "6", "--page-size", "2", "--json"]
    lower, upper = (CliRunner().invoke(cli, [*common, "--policy", name]) for name in ("lfu", "LFU"))
    assert upper.exit_code == 0, upper.output
    assert _figures(upper.stdout) == _figures(lower.stdout)


def _figures(out: str) -> tuple:
    report = json.loads(out)
    return report["policy"], report["hit_tokens"], report["evicted_blocks"]


@pytest.mark.parametrize(("finish", "in_flight"), [(5, True), (0.5, False)])
def test_a_recorded_trace_whose_requests_overlap_gets_the_in_flight_note(
    tmp_path: Path, finish: float, in_flight: bool
) -> None:
    """Regression: the sweep said Belady was no bound only above --concurrency 1, where the CLI says it whenever
    requests were in flight together: a recorded trace whose requests finish after the next arrives, at 1."""
    path = write_overlapping_recorded_trace(tmp_path / "recorded.jsonl", finish)
    args = [str(path), "--policy", "lru", "--fractions", "0.5", "--workers", "1", "--no-plot", "--block-size", "4"]
    result = CliRunner().invoke(load_script("simulate_eviction").main, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert ("can beat it" in (tmp_path / "out" / "sweep.md").read_text()) is in_flight


@pytest.mark.parametrize("seed", ["\u0663", "\uff13", "3\u00b2", "-3", "3.0"])
def test_a_synthetic_seed_of_other_than_ascii_digits_is_refused(seed: str) -> None:
    """`synthetic:chat@٣` passed str.isdigit and ran as seed 3 under the name 'chat@٣': a held-out seed that is not
    the one its row names."""
    from radixcache.errors import RadixCacheError
    from radixcache.sim.sweep import load_trace

    with pytest.raises(RadixCacheError, match="the seed after @ must be a non-negative integer"):
        load_trace(f"synthetic:chat@{seed}", 16, 512)
    assert load_trace("synthetic:chat@007", 16, 512)[0] == "chat@7"  # one seed, one name


def test_the_default_workers_are_the_cpus_this_process_may_run_on(tmp_path: Path, monkeypatch) -> None:
    """Under `taskset -c 0` on a 64-core host the sweep started 64 worker processes on one CPU (`os.cpu_count()`)."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    args = [str(tiny_trace(tmp_path)), "--policy", "lru", "--fractions", "0.5", "--page-size", "2", "--no-plot"]
    result = CliRunner().invoke(load_script("simulate_eviction").main, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "on 1 worker (this process)" in result.stderr
