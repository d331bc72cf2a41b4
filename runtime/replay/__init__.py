"""Replaying traces through an Engine: the whole API in one import.

    from radixcache.runtime.replay import ReplayConfig, load_replay_trace, replay

`sessions.py` reads the trace and plans its sessions and turns; `run.py` drives the replay (live or recorded, one at
a time or N in flight) through any GenerationEngine (an Engine, or the replicas' front door), building one
RequestOptions per turn; `comparison.py` runs it with and without the cache (`--compare`); `results.py` holds what
it reports.
"""

from __future__ import annotations

from radixcache.runtime.replay.comparison import compare, engine_factory
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
from radixcache.runtime.replay.run import replay
from radixcache.runtime.replay.sessions import (
    SAMPLE_TRACE,
    check_trace_for_model,
    load_replay_trace,
    plan_sessions,
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
    "check_trace_for_model",
    "compare",
    "engine_factory",
    "load_replay_trace",
    "plan_sessions",
    "replay",
    "sample_trace_path",
    "summarize",
]
