"""scripts/simulate_eviction.py writes its CSV, Markdown table and plot, and refuses unknown input."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.records import TokenRequest
from radixcache.trace import write_token_jsonl

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "simulate_eviction.py"


def load_script():
    spec = importlib.util.spec_from_file_location("simulate_eviction", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def tiny_trace(tmp_path: Path, name: str = "tiny", shared: int = 3) -> Path:
    trace = tmp_path / f"{name}.jsonl"
    write_token_jsonl(trace, [TokenRequest(i, (i % shared, 1, 2, 3, 4, 5, 6, 7), 0) for i in range(40)])
    return trace


def test_sweep_writes_csv_markdown_and_plot(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path)
    args = [str(trace), "--policy", "lru", "--policy", "reuse", "--fractions", "0.2,0.5", "--page-size", "2"]
    result = CliRunner().invoke(
        load_script().main, [*args, "--dead-bound", "--workers", "1", "--out", str(tmp_path / "out")]
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
    main = load_script().main
    assert CliRunner().invoke(main, ["synthetic:nope", "--out", str(tmp_path)]).exit_code != 0
    assert CliRunner().invoke(main, ["synthetic:chat", "--policy", "nope", "--out", str(tmp_path)]).exit_code != 0


def sweep_rows(tmp_path: Path, traces: list[str], workers: int) -> list[dict]:
    out = tmp_path / f"out{workers}"
    args = [*traces, "--policy", "lru", "--policy", "reuse", "--fractions", "0.2,0.5", "--page-size", "2"]
    result = CliRunner().invoke(load_script().main, [*args, "--workers", str(workers), "--no-plot", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"on {workers} worker" in result.stderr
    rows = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_parallel_sweep_gives_the_sequential_rows_in_order(tmp_path: Path) -> None:
    traces = [str(tiny_trace(tmp_path)), str(tiny_trace(tmp_path, "other", shared=7))]
    sequential = sweep_rows(tmp_path, traces, 1)
    assert len(sequential) == 2 * (1 + 2 * 4)  # per trace: infinite, then 2 capacities x (2 policies + 2 bounds)
    assert sweep_rows(tmp_path, traces, 2) == sequential


def test_ray_without_ray_installed_says_how_to_install_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("ray is installed")
    result = CliRunner().invoke(load_script().main, ["synthetic:chat", "--ray", "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert "pip install ray" in result.output
