"""scripts/bench_gguf_activations.py refuses `--modes` it cannot compare before it loads anything: fewer than two
modes, or a name that is not an activations mode (runtime.model.block_names.ACTIVATIONS); exit status 2 and a
message naming the choices."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.import_log import IMPORTTIME, imported

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_gguf_activations.py"


@pytest.mark.parametrize("modes", ["float", "float,int4", "", "int16-decode,,float"])
def test_modes_it_cannot_compare_exit_2_naming_the_choices(modes: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    r = subprocess.run(
        [*IMPORTTIME, str(SCRIPT), "--modes", modes], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--modes takes two or more of int16-decode, float, int16, int8, int8-decode, auto" in r.stderr
    assert "load average" not in r.stdout  # refused before anything ran
    assert "torch" not in imported(r.stderr)  # nor imported: refused at once
