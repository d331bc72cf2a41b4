"""`replay --record-trace --policy reuse`: the printed simulate command does not reproduce a reuse run's hit rate
(the engine inserts chunk by chunk, the simulator a prompt whole), and says so; other policies' commands match."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from radixcache.cli.main import main
from radixcache.cli.record import REUSE_NOTE


@pytest.mark.parametrize("policy", ["lru", "reuse"])
def test_the_printed_command_says_when_it_cannot_reproduce_the_hit_rate(
    runner, tiny_model_dir: Path, tmp_path: Path, policy: str
) -> None:
    recorded, out = tmp_path / "r.jsonl", tmp_path / "r.json"
    args = ["replay", "--model", str(tiny_model_dir), "--max-tokens", "4", "--capacity-blocks", "100"]
    args += ["--policy", policy, "--record-trace", str(recorded), "--json", str(out)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    command = result.stderr.split("its hit rate through the tree alone: ", 1)[1].splitlines()[0]
    simulated = runner.invoke(main, [*shlex.split(command)[1:], "--json"])
    assert simulated.exit_code == 0, simulated.output
    gap = abs(json.loads(simulated.stdout)["hit_rate"] - json.loads(out.read_text())["summary"]["hit_rate"])
    noted = REUSE_NOTE in result.stderr
    assert noted == (policy == "reuse")
    assert gap <= 0.01 or noted  # a command that does not reproduce the run says so
    if policy == "reuse":
        assert gap > 0.01  # (what the note is for: here 65.6% against 69.0%)
