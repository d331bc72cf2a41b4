"""Both runs of `radixcache replay --compare`: the replay with the cache, then without it (`compare`), and the
`make_engine(enable_cache)` that builds their engines from one loaded model (`engine_factory`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from radixcache.runtime.engine.protocol import GenerationEngine
from radixcache.runtime.replay.results import (
    Comparison,
    ReplayConfig,
    ReplayError,
    ReplayResult,
    RequestRecord,
    SkippedTurn,
    summarize,
)
from radixcache.runtime.replay.run import _checked, replay
from radixcache.trace import Conversation, Trace
from radixcache.trace.records import TokenRequest


def compare(
    make_engine: Callable[[bool], GenerationEngine],
    trace: Trace | Sequence[Conversation] | Sequence[TokenRequest],
    config: ReplayConfig | None = None,
    *,
    on_start: Callable[[str], None] | None = None,
    on_result: Callable[[RequestRecord | SkippedTurn], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Comparison:
    """Replay with the cache (`make_engine(True)`), then without it (`make_engine(False)`), and compare.

    The first engine is dropped before the second is built, so their KV pools are never both alive. When Ctrl-C
    stops the first run, or the second's engine before its turns, the second's result is empty, marked interrupted.
    """
    config = _checked(config, on_start=on_start, on_result=on_result, on_warning=on_warning)
    if not callable(make_engine):
        raise ReplayError(f"make_engine must be a function of enable_cache, got {type(make_engine).__name__}")
    results = []
    for enabled in (True, False):
        label = "cache" if enabled else "no cache"
        if not results or not results[0].summary.interrupted:
            if on_start is not None:
                on_start(label)
            try:
                engine = make_engine(enabled)
                results.append(replay(engine, trace, config, label=label, on_result=on_result, on_warning=on_warning))
                del engine
                continue
            except KeyboardInterrupt:  # while the second engine is built or warms up: the first run is still kept
                if not results:
                    raise
        empty = summarize([], label=label, cache=False, mode=config.mode, interrupted=True)
        results.append(ReplayResult(empty, ()))
    return Comparison(results[0], replace(results[1], summary=replace(results[1].summary, cache=False)))


def engine_factory(model: Any = "smollm2", **engine_kwargs: Any) -> Callable[[bool], GenerationEngine]:
    """`make_engine(enable_cache)` for `compare`. The first call builds the model from `model` (a name, a path,
    a loaded model); later calls reuse its weights and tokenizer, so they are loaded and converted once."""
    from radixcache.runtime.engine.engine import Engine

    built: dict[str, Any] = {}

    def make(enable_cache: bool) -> GenerationEngine:
        # The baseline keeps no pages, so it has no tiers under it (an Engine refuses the two together): a comparison
        # of a tiered cache runs the baseline without them instead of failing after the cached run.
        kwargs = engine_kwargs if enable_cache else {**engine_kwargs, "host_kv_memory": None, "cache_dir": None}
        if built:
            return Engine(built["model"], tokenizer=built["tokenizer"], enable_cache=enable_cache, **kwargs)
        engine = Engine(model, enable_cache=enable_cache, **kwargs)
        built.update(model=engine.model, tokenizer=engine.tokenizer)
        return engine

    return make
