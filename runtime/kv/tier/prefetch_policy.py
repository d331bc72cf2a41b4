"""The prefetch policies' names, defaults and their check, without torch: the CLI builds its options from them
before any model loads (`radixcache cache` never imports torch). What each policy does: runtime.kv.tier.prefetch."""

from __future__ import annotations

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
DEFAULT_PREFETCH_POLICY = "timeout"
DEFAULT_PREFETCH_TIMEOUT_MS = 1000.0


def check_prefetch(policy: str, timeout_ms: float) -> None:
    """Raise ValueError naming the option when a prefetch policy or its timeout is not valid."""
    if policy not in PREFETCH_POLICIES:
        raise ValueError(f"prefetch_policy must be one of {', '.join(PREFETCH_POLICIES)}, got {policy!r}")
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not 0 <= timeout_ms < float("inf"):
        raise ValueError(f"prefetch_timeout_ms must be a finite number of milliseconds >= 0, got {timeout_ms!r}")
