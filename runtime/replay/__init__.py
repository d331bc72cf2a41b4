"""Replaying traces through an Engine: the whole API in one import.

    from radixcache.runtime.replay import ReplayConfig, load_replay_trace, replay

`run.py` drives the replay (live or recorded, one at a time or N in flight); `results.py` holds what it reports.
"""

from __future__ import annotations

from radixcache.runtime.replay.results import (
    DEFAULT_MAX_TOKENS,
    MODES,
    SKIP_KV_FULL,
    SKIP_TOO_LONG,
    Comparison,
    ReplayConfig,
    ReplayError,
    ReplayResult,
    ReplaySummary,
    RequestRecord,
    SkippedTurn,
    summarize,
)
from radixcache.runtime.replay.run import (
    SAMPLE_TRACE,
    compare,
    engine_factory,
    load_replay_trace,
    plan_sessions,
    replay,
    sample_trace_path,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MODES",
    "SAMPLE_TRACE",
    "SKIP_KV_FULL",
    "SKIP_TOO_LONG",
    "Comparison",
    "ReplayConfig",
    "ReplayError",
    "ReplayResult",
    "ReplaySummary",
    "RequestRecord",
    "SkippedTurn",
    "compare",
    "engine_factory",
    "load_replay_trace",
    "plan_sessions",
    "replay",
    "sample_trace_path",
    "summarize",
]
