"""Helpers for simulator tests: build tiny workloads by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MOONCAKE_TRACE = SHARED_TRACES / "mooncake_synthetic_trace.jsonl"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py as a module (the scripts are files, not a package), with scripts/ on sys.path as
    when it runs (its helpers, such as script_args, import by name)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_overlapping_recorded_trace(path: Path, finish: float) -> Path:
    """Four recorded hash requests, one a millisecond, each finishing `finish` ms after it arrives: past 1, each is
    still in flight when the next arrives (Belady is then no bound, docs/simulator.md)."""
    import json

    lines = [
        {"timestamp": i, "input_length": 8, "output_length": 1, "hash_ids": [1, 2 + i % 2], "output_hash_ids": []}
        | {"finish_timestamp": i + finish}
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
