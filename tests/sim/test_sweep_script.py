"""scripts/simulate_eviction.py writes its CSV, Markdown table and plot, and refuses unknown input."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

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


def test_sweep_writes_csv_markdown_and_plot(tmp_path: Path) -> None:
    trace = tmp_path / "tiny.jsonl"
    write_token_jsonl(trace, [TokenRequest(i, (i % 3, 1, 2, 3, 4, 5, 6, 7), 0) for i in range(40)])
    args = [str(trace), "--policy", "lru", "--policy", "reuse", "--fractions", "0.2,0.5", "--page-size", "2"]
    result = CliRunner().invoke(load_script().main, [*args, "--dead-bound", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "out" / "sweep.csv").read_text().splitlines()))
    assert {r["policy"] for r in rows} == {"lru", "reuse", "belady", "lru-dead", "infinite"}
    assert len(rows) == 1 + 2 * 4
    table = (tmp_path / "out" / "sweep.md").read_text()
    assert "| capacity (blocks) |" in table and "belady" in table
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 1000


def test_sweep_refuses_unknown_policies_and_workloads(tmp_path: Path) -> None:
    main = load_script().main
    assert CliRunner().invoke(main, ["synthetic:nope", "--out", str(tmp_path)]).exit_code != 0
    assert CliRunner().invoke(main, ["synthetic:chat", "--policy", "nope", "--out", str(tmp_path)]).exit_code != 0
