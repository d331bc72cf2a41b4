"""runtime: a PyTorch inference runtime that prefills only what the radix cache lacks.

`from runtime import Engine` works; the heavy modules (torch) load on first use, so `import runtime.config`
stays cheap for loaders and tools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.engine import Engine, EngineStats
    from runtime.request import GenerationResult
    from runtime.sampling import SamplingParams

__all__ = ["Engine", "EngineStats", "GenerationResult", "SamplingParams"]

_LAZY = {
    "Engine": "runtime.engine",
    "EngineStats": "runtime.engine",
    "GenerationResult": "runtime.request",
    "SamplingParams": "runtime.sampling",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
