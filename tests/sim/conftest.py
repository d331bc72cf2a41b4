"""Helpers for simulator tests: build tiny workloads by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MOONCAKE_TRACE = SHARED_TRACES / "mooncake_synthetic_trace.jsonl"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """Import scripts/<name>.py as a module (the scripts are files, not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
