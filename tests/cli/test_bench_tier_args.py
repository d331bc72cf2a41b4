"""scripts/bench_tiers.py, scripts/bench_tier_prefetch.py and scripts/bench_page_tier.py refuse a bad count by its
option's name before the model (or the trace) loads: --reps 0 reported infinite costs, --page-size 0 was a traceback
from inside the engine, a --at the decode never reaches a failed assert 120 s into the run, and bench_page_tier's
--rounds 0 a median of nothing after the replay (script_args.at_least, as bench_agents uses). The refusal comes
before torch is imported (seconds), not after."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.import_log import IMPORTTIME, imported

REPO = Path(__file__).resolve().parents[2]
MISSING_MODEL = "/nonexistent/model"  # reached only if the arguments passed: a different failure


@pytest.mark.parametrize(
    ("script", "args", "named"),
    [
        ("bench_tiers.py", ["--page-size", "0"], "--page-size"),
        ("bench_tiers.py", ["--pages", "-3"], "--pages"),
        ("bench_tiers.py", ["--reps", "0"], "--reps"),
        ("bench_tiers.py", ["--rounds", "x"], "--rounds"),
        ("bench_tier_prefetch.py", ["--page-size", "0"], "--page-size"),
        ("bench_tier_prefetch.py", ["--rounds", "0"], "--rounds"),
        ("bench_tier_prefetch.py", ["--settle", "nan"], "--settle"),
        ("bench_tier_prefetch.py", ["--at", "48", "--decode-tokens", "48"], "--at"),
        ("bench_page_tier.py", ["--rounds", "0"], "--rounds"),
        ("bench_page_tier.py", ["--host-blocks", "-1"], "--host-blocks"),
    ],
)
def test_a_bad_count_is_a_usage_error_naming_it_before_the_model_loads(script: str, args: list[str], named: str):
    command = [*IMPORTTIME, str(REPO / "scripts" / script), "--model", MISSING_MODEL, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {named}" in done.stderr
    assert "torch" not in imported(done.stderr)  # refused at once, not after torch's import


@pytest.mark.parametrize("content", [None, "not json\n"])
def test_bench_page_tier_refuses_a_missing_or_malformed_trace_by_name(tmp_path, content: str | None):
    """A missing --trace, or one its reader refuses, was a TraceError traceback: a usage error naming it now."""
    trace = tmp_path / "t.jsonl"
    if content is not None:
        trace.write_text(content)
    command = [*IMPORTTIME, str(REPO / "scripts" / "bench_page_tier.py"), "--trace", str(trace)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "argument --trace" in done.stderr and "Traceback" not in done.stderr
    assert "torch" not in imported(done.stderr)
