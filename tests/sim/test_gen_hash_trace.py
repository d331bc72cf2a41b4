"""scripts/gen_hash_trace.py: a trace the simulator reads; bad arguments refused by name before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.trace.workload import load_workload
from tests.refusals import assert_refused
from tests.sim.conftest import SCRIPTS, load_script


def test_the_trace_reads_back_at_its_block_size(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    ids = load_script("gen_hash_trace").write_hash_trace(path, 40, block_size=8, seed=3)
    workload = load_workload(str(path), block_size=8)
    assert len(workload.requests) == 40 and sum(len(r.prompt) for r in workload.requests) == ids


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--requests", "0"], "--requests"),
        (["--requests", "-1"], "--requests"),
        (["--block-size", "0"], "--block-size"),
    ],
)
def test_a_count_or_block_size_below_one_is_refused_by_name(tmp_path: Path, args: list[str], option: str) -> None:
    """--block-size 0 was a ValueError traceback from inside the generator; --requests -1 wrote an empty file, which
    no reader can take ("empty file: cannot detect the trace format"), and said '-1 requests'."""
    out = tmp_path / "t.jsonl"
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "gen_hash_trace.py"), str(out), *args], capture_output=True, text=True
    )
    assert_refused(result, option, "expected an int >= 1")
    assert not out.exists()
    with pytest.raises(ValueError, match="must be an int >= 1"):
        load_script("gen_hash_trace").write_hash_trace(out, 0 if option == "--requests" else 5, block_size=0)
    assert not out.exists()


def test_an_interrupted_run_leaves_no_shorter_trace_for_the_bench_to_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trace was written in place, so Ctrl-C during a long generation left its first lines at `path`; and
    scripts/bench_simulator.py keeps its traces between runs (it generates one only when the file is missing), so the
    next run timed that shorter trace under the full size's name."""
    module = load_script("gen_hash_trace")
    real_dumps, calls = module.orjson.dumps, []

    def interrupted(record: object) -> bytes:
        calls.append(record)
        if len(calls) == 30:
            raise KeyboardInterrupt
        return real_dumps(record)

    monkeypatch.setattr(module.orjson, "dumps", interrupted)
    path = tmp_path / "hash100.jsonl"
    with pytest.raises(KeyboardInterrupt):
        module.write_hash_trace(path, 100, block_size=16)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # nothing at `path`: the bench generates it again, whole
    module.write_hash_trace(path, 100, block_size=16)
    assert len(load_workload(str(path), block_size=16).requests) == 100


def test_a_path_whose_name_is_near_the_file_systems_limit_is_written(tmp_path: Path) -> None:
    """The trace was staged at `{path}.{pid}.partial`, a dozen bytes longer than its name: a name of 245 bytes (the
    file system takes 255) failed with 'File name too long'. It stages as the trace commands do (cli/trace.py)."""
    path = tmp_path / ("t" * 245 + ".jsonl")
    ids = load_script("gen_hash_trace").write_hash_trace(path, 20, block_size=8, seed=1)
    assert sum(len(r.prompt) for r in load_workload(str(path), block_size=8).requests) == ids
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
