"""The prefetch policies' names, defaults and their check, without torch: the CLI builds its options from them
before any model loads (`radixcache cache` never imports torch). What each policy does: runtime.kv.tier.prefetch."""

from __future__ import annotations

import sys

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
DEFAULT_PREFETCH_POLICY = "timeout"
DEFAULT_PREFETCH_TIMEOUT_MS = 1000.0


def check_prefetch(policy: str, timeout_ms: float) -> None:
    """Raise ValueError naming the option when a prefetch policy or its timeout is not valid."""
    if policy not in PREFETCH_POLICIES:
        raise ValueError(f"prefetch_policy must be one of {', '.join(PREFETCH_POLICIES)}, got {policy!r}")
    # <= the largest float: an int past it (10**400) passed as finite, then float() raised OverflowError
    if (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, (int, float))
        or not 0 <= timeout_ms <= sys.float_info.max
    ):
        raise ValueError(f"prefetch_timeout_ms must be a finite number of milliseconds >= 0, got {timeout_ms!r}")


DEFAULT_PAGES_PER_STEP = 16  # page reads started per step beside decodes (SmolLM2: 16 pages, about 4 ms of CPU)


def check_pages_per_step(pages: object) -> None:
    """ValueError unless `pages` (page reads per step beside decodes; 0: unpaced) is an int >= 0."""
    if isinstance(pages, bool) or not isinstance(pages, int) or pages < 0:
        raise ValueError(f"prefetch_pages_per_step must be an integer >= 0 (0: unpaced), got {pages!r}")
