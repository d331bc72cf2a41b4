"""Callbacks that do not keep their object alive.

An engine's parts call back into each other (the tiers into the KV pool's copies, the loop into the heap timer and
back). A bound method held in both directions makes a reference cycle, which only the cyclic garbage collector
frees, and one that lived as long as an engine only at a full collection, which can come long after the engine is
dropped: in the test suite's workers the KV pools and quantised weights of dropped engines piled up to 10 GB each.
Holding one direction weakly lets reference counting free the whole engine the moment its last user lets go.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def weak_method(method: Callable[..., Any], default: Any = None) -> Callable[..., Any]:
    """A callable that calls the bound `method` while its object lives, and returns `default` once it is gone."""
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]  # TypeError for anything but a bound method

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        return default if bound is None else bound(*args, **kwargs)

    return call
