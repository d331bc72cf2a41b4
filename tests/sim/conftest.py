"""Helpers for simulator tests: build tiny workloads by hand."""

from __future__ import annotations

from pathlib import Path

SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MOONCAKE_TRACE = SHARED_TRACES / "mooncake_synthetic_trace.jsonl"
