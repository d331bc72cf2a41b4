"""runtime: a PyTorch inference runtime that prefills only what the radix cache lacks.

Installed as `radixcache.runtime` (no top-level `runtime`: tests/test_packaging.py): `from radixcache.runtime import
Engine` works; the heavy modules (torch) load on first use, so `import radixcache.runtime.config` stays cheap for
loaders and tools.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# libgomp (the OpenMP that torch and MKL run on) cuts its spin-wait to almost nothing once the process holds more
# OpenMP threads than CPUs: as soon as the engine loop thread and the caller's thread each own a team. Every
# parallel kernel then sleeps and wakes its workers, and a decode step on the loop thread ran 1.7-2.3x slower
# than the same step on the main thread (docs/benchmarks.md). An explicit ACTIVE policy with libgomp's ordinary
# spin count (300,000 iterations, then sleep) keeps the unthrottled behaviour. Defaults only: the user's
# environment wins. They act only if torch is not loaded yet, which holds whenever runtime is imported first.
os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "300000")

from radixcache.moved import install as _install_moved_paths
from radixcache.runtime.moved import RUNTIME_MOVED

_install_moved_paths(RUNTIME_MOVED)  # the runtime's old import paths (radixcache.runtime.kv.disk, ...)

if TYPE_CHECKING:
    from radixcache.runtime.engine.engine import Engine
    from radixcache.runtime.engine.engine_config import EngineConfig
    from radixcache.runtime.engine.options import RequestOptions
    from radixcache.runtime.engine.protocol import GenerationEngine
    from radixcache.runtime.engine.request import GenerationResult
    from radixcache.runtime.engine.sampling import SamplingParams
    from radixcache.runtime.engine.stats import EngineStats

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "GenerationEngine",
    "GenerationResult",
    "RequestOptions",
    "SamplingParams",
]

_LAZY = {
    "Engine": "radixcache.runtime.engine.engine",
    "EngineConfig": "radixcache.runtime.engine.engine_config",
    "EngineStats": "radixcache.runtime.engine.stats",
    "GenerationEngine": "radixcache.runtime.engine.protocol",
    "GenerationResult": "radixcache.runtime.engine.request",
    "RequestOptions": "radixcache.runtime.engine.options",
    "SamplingParams": "radixcache.runtime.engine.sampling",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
