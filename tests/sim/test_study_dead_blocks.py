"""scripts/study_dead_blocks.py: every run sits between LRU and what its knowledge allows, on a generated trace."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "study_dead_blocks.py"


def test_the_study_prints_a_row_per_capacity_with_ordered_bounds(tmp_path: Path) -> None:
    """Documents reread a few times (short answers) among one-off requests (long answers): the ordering the study
    relies on holds (lru <= fresh-dead <= lru-dead <= belady), and knowing the output class helps here."""
    rng = random.Random(0)
    path = tmp_path / "m.jsonl"
    docs = [list(range(1000 * d, 1000 * d + 6)) for d in range(30)]
    fresh = iter(range(10**6, 10**7))
    with path.open("w") as out:
        for t in range(400):
            if rng.random() < 0.5:
                ids, output = [*rng.choice(docs), next(fresh)], 8
            else:
                ids, output = [next(fresh) for _ in range(6)], 700
            out.write(
                json.dumps({"timestamp": t, "input_length": 16 * len(ids), "output_length": output, "hash_ids": ids})
            )
            out.write("\n")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--block-size", "16", "--fractions", "0.05,0.1"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        lru, belady, dead, fresh_dead, by_class = (float(c.split("%")[0]) for c in cells[1:6])
        assert lru <= fresh_dead <= dead <= belady
        assert by_class > lru


def _run_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], script: str, *argv: str
) -> tuple[object, str, str]:
    """scripts/<script>.py's main() run here with `argv` as its command line (a refusal is argparse's exit, which
    a process start per case only made slower): its exit code, standard output and standard error. An exception
    other than SystemExit (the traceback a refusal must not be) fails the test."""
    main = load_script(script).main
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.mark.parametrize("script", ["study_dead_blocks", "study_insertion", "study_age_oracle"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fractions", "0"], "--fractions '0': expected finite numbers > 0"),
        (["--fractions", "0.1,nan"], "--fractions '0.1,nan': expected finite numbers > 0"),
        (["--block-size", "0"], "--block-size must be an int >= 1, got 0"),
    ],
)
def test_the_studies_refuse_bad_fractions_and_block_sizes_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    script: str,
    args: list[str],
    message: str,
) -> None:
    """Regression: a fraction of 0 or NaN was a RadixCacheError traceback after the table's header (in
    study_age_oracle after its models were fitted, minutes on Mooncake), a block size of 0 a ZeroDivisionError."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]}\n')
    code, out, err = _run_in_process(monkeypatch, capsys, script, str(path), *args)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert out == ""


@pytest.mark.parametrize(
    ("script", "args", "named"),
    [
        ("study_dead_blocks", ["--threshold", "nan"], "argument --threshold"),
        ("study_dead_blocks", ["--threshold", "2"], "argument --threshold"),
        ("study_age_oracle", ["--refit", "0"], "argument --refit"),
        ("study_age_oracle", ["--min-events", "-1"], "argument --min-events"),
        ("study_age_oracle", ["--scores", "p:abc"], "--scores: each score is p:H or eva:H with H an int >= 1"),
        ("study_age_oracle", ["--scores", "eva:0"], "--scores: each score is p:H or eva:H with H an int >= 1"),
    ],
)
def test_the_studies_refuse_bad_options_by_name_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    script: str,
    args: list[str],
    named: str,
) -> None:
    """Regression: --refit 0 was a ZeroDivisionError after the fitting, --scores p:abc int()'s traceback, and a NaN
    --threshold, a negative --min-events or a horizon of 0 ran on and printed a table."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]}\n')
    code, out, err = _run_in_process(monkeypatch, capsys, script, str(path), "--block-size", "16", *args)
    assert code == 2 and named in err and "Traceback" not in err, err
    assert out == ""
