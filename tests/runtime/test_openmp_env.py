"""`import runtime` sets libgomp's spin defaults before torch loads, and never overrides the user's values.

Run in fresh interpreters: the settings only matter (and are only observable as set by us) in a process where
torch has not been imported yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = "import os, runtime; print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])"


def _run(env_extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} | env_extra
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_runtime_sets_the_unthrottled_spin_defaults() -> None:
    assert _run({}) == "ACTIVE 300000"


def test_the_users_environment_wins() -> None:
    assert _run({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}) == "PASSIVE 0"
    assert _run({"GOMP_SPINCOUNT": "1000"}) == "ACTIVE 1000"


def test_importing_runtime_does_not_import_torch() -> None:
    """The defaults act only if torch loads after them: `import runtime` itself must not pull torch in."""
    probe = "import sys, runtime; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
