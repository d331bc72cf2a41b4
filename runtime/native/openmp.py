"""Keep the engine loop thread's OpenMP team unthrottled by releasing the idle team of a thread that waits on it.

libgomp (the OpenMP runtime torch, MKL and radixcache.runtime.native run on) shortens every team's spin-wait to about a
thousand iterations once the process manages more OpenMP threads than it has CPUs. Each thread that ever ran a
parallel kernel owns a team, and keeps it: so as soon as the caller's thread (which loaded the model) and the
engine loop thread both have one, on a 2-core machine, every parallel kernel of a decode step puts its workers to
sleep and wakes them again. Measured on this project's VM: the same batch-1 decode step took 13.3 ms on a thread
alone and 15.4 to 15.9 ms while another thread's idle team existed (docs/benchmarks.md).

`release_idle_team()` frees the calling thread's team (OpenMP 5.0 `omp_pause_resource_all(omp_pause_soft)`,
which libgomp applies to the calling thread's pool only). The engine calls it on the caller's side whenever a
request or call is handed to the loop thread, that is when the caller is about to wait. The caller's next
parallel kernel simply builds a new team. Where the process has no libgomp loaded (another OpenMP runtime, or
none), it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os

_OMP_PAUSE_SOFT = 1


@functools.lru_cache(maxsize=1)  # memoised lookup, never mutated
def _pause_all() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """`omp_pause_resource_all` of the libgomp already in the process, or None (never loads one)."""
    try:
        lib = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except (OSError, AttributeError):  # not loaded, not Linux, or no RTLD_NOLOAD
        return None
    fn = getattr(lib, "omp_pause_resource_all", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
    return fn


def release_idle_team() -> bool:
    """Free the calling thread's idle OpenMP team. True if libgomp did; call it only outside parallel regions
    (a Python thread between torch calls always is)."""
    fn = _pause_all()
    return fn is not None and fn(_OMP_PAUSE_SOFT) == 0
