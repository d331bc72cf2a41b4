"""The sweeps' output folder (scripts/sweep_output.py): checked before the first cell, so a sweep that cannot write
its results, or plot them, says so at once instead of with a traceback after the last cell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.trace import write_token_jsonl
from radixcache.trace.records import TokenRequest
from tests.refusals import assert_refused
from tests.sim.conftest import load_script

#: each sweep with the arguments of a small run, and the line it prints before its first cell
SWEEPS = {
    "simulate_eviction": (
        ["--policy", "lru", "--fractions", "0.5", "--page-size", "2", "--workers", "1"],
        "replays on",
    ),
    "simulate_routing": (
        ["--replicas", "2", "--router", "round_robin", "--capacity-blocks", "8", "--page-size", "2", "--workers", "1"],
        "routed replays on",
    ),
}


def tiny_trace(tmp_path: Path) -> Path:
    trace = tmp_path / "tiny.jsonl"
    write_token_jsonl(trace, [TokenRequest(i, (i % 3, 1, 2, 3, 4, 5, 6, 7), 1) for i in range(20)])
    return trace


@pytest.mark.parametrize("script", sorted(SWEEPS))
def test_an_out_folder_that_cannot_be_made_is_refused_before_any_cell(tmp_path: Path, script: str) -> None:
    """Regression: --out under a file (or on a read-only file system) ran every cell, then failed with a
    FileExistsError traceback from mkdir: the sweep's results were lost, none written."""
    args, started = SWEEPS[script]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "out"
    result = CliRunner().invoke(load_script(script).main, [str(tiny_trace(tmp_path)), *args, "--out", str(out)])
    output = assert_refused(result, f"--out {out}: ")
    assert started not in output, "the folder is checked before the first cell runs"


@pytest.mark.parametrize("script", sorted(SWEEPS))
def test_a_plot_without_matplotlib_is_refused_before_any_cell(
    tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: without matplotlib (a dev extra, not a dependency) the sweep ran every cell and wrote its CSV,
    then failed with an ImportError traceback, before it printed its table. It is a usage error at once now, and
    --no-plot runs without it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # how Python sees a package that is not installed
    args, started = SWEEPS[script]
    trace, out = str(tiny_trace(tmp_path)), tmp_path / "out"
    main = load_script(script).main
    refused = assert_refused(CliRunner().invoke(main, [trace, *args, "--out", str(out)]), "pip install matplotlib")
    assert "--no-plot" in refused and started not in refused
    assert not out.exists()
    result = CliRunner().invoke(main, [trace, *args, "--out", str(out), "--no-plot"])
    assert result.exit_code == 0, result.output
    assert sorted(p.suffix for p in out.iterdir()) == [".csv", ".md"]


@pytest.mark.parametrize("script", sorted(SWEEPS))
@pytest.mark.parametrize("cut", ["csv", "png"])
def test_a_sweep_cut_while_writing_leaves_the_earlier_files_whole(
    tmp_path: Path, script: str, cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the CSV, the table and the plot were written in place, so a sweep stopped while writing one
    (Ctrl-C, a kill, a full disk) left the earlier sweep's file cut short: a CSV of fewer rows reads as a sound
    result. Each is written whole now, through a staging file moved onto it."""
    import csv

    import matplotlib.figure

    args, _ = SWEEPS[script]
    trace, out = str(tiny_trace(tmp_path)), tmp_path / "out"
    main = load_script(script).main
    assert CliRunner().invoke(main, [trace, *args, "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(Path(name).suffix for name in before) == [".csv", ".md", ".png"]

    if cut == "csv":
        real = csv.writer

        def writer(handle: object, *a: object, **k: object) -> object:
            inner = real(handle, *a, **k)

            class Cut:
                rows = 0

                def writerow(self, row: object) -> object:
                    self.rows += 1
                    if self.rows > 1:  # the header is out, the rows are not
                        raise KeyboardInterrupt
                    return inner.writerow(row)

                def writerows(self, rows: object) -> None:
                    for row in rows:  # type: ignore[attr-defined]
                        self.writerow(row)

            return Cut()

        monkeypatch.setattr(csv, "writer", writer)
    else:

        def savefig(self: object, where: object, *a: object, **k: object) -> None:
            Path(where).write_bytes(b"\x89PNG cut short")  # type: ignore[arg-type]
            raise KeyboardInterrupt

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    result = CliRunner().invoke(main, [trace, *args, "--out", str(out)])
    assert result.exit_code != 0
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert not [name for name in after if name.endswith(".partial")], after.keys()
    kept = next(name for name in before if name.endswith(f".{cut}"))
    assert after[kept] == before[kept], f"{kept} was cut short"


@pytest.mark.parametrize(
    ("script", "written", "doc"),
    [("simulate_eviction", "sweep.csv", "docs/simulator.md"), ("simulate_routing", "routing.csv", "docs/routing.md")],
)
def test_the_csv_columns_are_the_documented_ones(tmp_path: Path, script: str, written: str, doc: str) -> None:
    """The CSVs' columns were documented nowhere ("one row per replay"): a reader had to guess that the infinite row's
    capacity_fraction is inf or what a routing rate is. The docs list them now, in the order the file has them."""
    import csv
    import re

    args, _ = SWEEPS[script]
    out = tmp_path / "out"
    result = CliRunner().invoke(load_script(script).main, [str(tiny_trace(tmp_path)), *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    header = next(csv.reader((out / written).read_text().splitlines()))
    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    listed = re.search(rf"`{re.escape(written)}` columns: (.*?)[.:](?:\s|$)", text, re.S)
    assert listed is not None, f"{doc} does not list the columns of {written}"
    assert re.findall(r"`(\w+)`", listed.group(1)) == header
