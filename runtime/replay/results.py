"""What a replay reports: its configuration, one record per request, skipped turns, and the summaries."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from radixcache.runtime.engine.sampling import MAX_TEMPERATURE
from radixcache.stats import percentile

MODES = ("live", "recorded")
DEFAULT_MAX_TOKENS = 32
SKIP_TOO_LONG = "too_long"
SKIP_KV_FULL = "kv_full"


class ReplayError(ValueError):
    """The replay cannot start: an unusable trace, an option out of range, or a feature the engine lacks."""


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How to replay. max_tokens overrides every turn's own limit (trace `max_tokens` / `output_length`, else
    `default_max_tokens`). limit: the first N conversations (sessions of a token trace). temperature 0 is
    greedy; with sampling, the i-th request in replay order uses seed `seed + i` (whatever the concurrency), so
    runs with and without the cache see the same random stream."""

    mode: str = "live"
    max_tokens: int | None = None
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    limit: int | None = None
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = 1
    honor_timestamps: bool = False
    warmup: bool = True

    def __post_init__(self) -> None:
        """Each field of its type and in range, else a ReplayError naming it, before anything runs (a float limit,
        a string seed or a NaN temperature passed here and failed mid-run, after the warm-up, some as a bare
        TypeError)."""
        if self.mode not in MODES:
            raise ReplayError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("max_tokens", "limit", "default_max_tokens", "concurrency"):
            value = getattr(self, name)
            if value is None and name in ("max_tokens", "limit"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ReplayError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ReplayError(f"seed must be an int, got {self.seed!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TEMPERATURE:  # NaN fails too
            raise ReplayError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}], got {t!r}")
        for name in ("honor_timestamps", "warmup"):
            if not isinstance(getattr(self, name), bool):
                raise ReplayError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request. Times in seconds; start_s is when it started, counted from the run's start."""

    conversation: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    output_tokens: int
    ttft_s: float
    latency_s: float
    decode_tps: float
    finish_reason: str
    text: str
    start_s: float

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cached_fraction": self.cached_fraction}


@dataclass(frozen=True, slots=True)
class SkippedTurn:
    """A turn that was not run: `too_long` (prompt >= the model's context) or `kv_full` (larger than the cache)."""

    conversation: str
    turn: int
    prompt_tokens: int
    reason: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """Totals of one run. hit_rate: cached / prompt tokens. decode_tps: tokens after the first of each request
    over the time spent after its first token. wall_s: the whole run, warm-up excluded."""

    label: str
    cache: bool
    mode: str
    requests: int
    conversations: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    output_tokens: int
    hit_rate: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    decode_tps: float
    wall_s: float
    skipped_too_long: int
    skipped_kv_full: int
    interrupted: bool
    model: str = ""
    policy: str = ""
    page_size: int = 0
    capacity_blocks: int = 0
    concurrency: int = 1
    tiers: bool = False  # the engine had a host tier or a cache directory
    host_hit_tokens: int = 0  # of cached_tokens, those loaded back from the host tier
    disk_hit_tokens: int = 0  # ... and from the disk tier; the rest were on the device
    declined_pages: int = 0  # pages found on the host or the disk but recomputed (measured cheaper: LoadCosts)

    @property
    def device_hit_tokens(self) -> int:
        return self.cached_tokens - self.host_hit_tokens - self.disk_hit_tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"device_hit_tokens": self.device_hit_tokens}


@dataclass(frozen=True, slots=True)
class ReplayResult:
    summary: ReplaySummary
    requests: tuple[RequestRecord, ...]
    skipped: tuple[SkippedTurn, ...] = ()
    # replay(record_trace=...)'s TraceRecorder, closed (its `written` lines, and `stopped`: why it stopped early, a
    # write that failed, or None); None without a recording. Not in the JSON.
    recorder: Any = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape: {"summary": {...}, "requests": [...], "skipped": [...]}."""
        return {
            "summary": self.summary.as_dict(),
            "requests": [r.as_dict() for r in self.requests],
            "skipped": [s.as_dict() for s in self.skipped],
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """The same replay with and without the cache. Ratios are no-cache / cache: above 1 means the cache helps."""

    cached: ReplayResult
    uncached: ReplayResult

    @property
    def ttft_p50_speedup(self) -> float:
        return _ratio(self.uncached.summary.ttft_p50_s, self.cached.summary.ttft_p50_s)

    @property
    def ttft_mean_speedup(self) -> float:
        return _ratio(self.uncached.summary.ttft_mean_s, self.cached.summary.ttft_mean_s)

    @property
    def wall_speedup(self) -> float:
        return _ratio(self.uncached.summary.wall_s, self.cached.summary.wall_s)

    @property
    def prefill_reduction(self) -> float:
        return _ratio(self.uncached.summary.prefill_tokens, self.cached.summary.prefill_tokens)

    @property
    def text_mismatches(self) -> int:
        """Requests (matched by conversation and turn) whose generated text differs between the two runs."""
        other = {(r.conversation, r.turn): r.text for r in self.uncached.requests}
        keys = [((r.conversation, r.turn), r.text) for r in self.cached.requests]
        return sum(1 for key, text in keys if key in other and other[key] != text)

    @property
    def text_compared(self) -> int:
        """Requests that ran in both runs, whose texts `text_mismatches` compared: fewer than the cached run's when a
        run was interrupted (none when the run without the cache never started)."""
        other = {(r.conversation, r.turn) for r in self.uncached.requests}
        return sum(1 for r in self.cached.requests if (r.conversation, r.turn) in other)

    def as_dict(self) -> dict[str, Any]:
        """The cached run's shape, plus "no_cache" (the other run) and "comparison" (the ratios)."""
        return {
            **self.cached.as_dict(),
            "no_cache": self.uncached.as_dict(),
            "comparison": {
                "ttft_p50_speedup": self.ttft_p50_speedup,
                "ttft_mean_speedup": self.ttft_mean_speedup,
                "wall_speedup": self.wall_speedup,
                "prefill_reduction": self.prefill_reduction,
                "text_mismatches": self.text_mismatches,
                "text_compared": self.text_compared,
            },
        }


# ---------------------------------------------------------------------------------------------- summary


def summarize(
    records: Iterable[RequestRecord],
    skipped: Iterable[SkippedTurn] = (),
    *,
    label: str = "cache",
    cache: bool = True,
    mode: str = "live",
    wall_s: float = 0.0,
    interrupted: bool = False,
    **info: Any,
) -> ReplaySummary:
    """The summary of finished requests (and skipped turns)."""
    records, skipped = list(records), list(skipped)
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    ttfts = [r.ttft_s for r in records]
    decode_tokens = sum(max(0, r.output_tokens - 1) for r in records)
    decode_time = sum(max(0.0, r.latency_s - r.ttft_s) for r in records)
    return ReplaySummary(
        label=label,
        cache=cache,
        mode=mode,
        requests=len(records),
        conversations=len({r.conversation for r in records}),
        prompt_tokens=prompt,
        cached_tokens=cached,
        prefill_tokens=sum(r.prefill_tokens for r in records),
        output_tokens=sum(r.output_tokens for r in records),
        hit_rate=cached / prompt if prompt else 0.0,
        ttft_mean_s=sum(ttfts) / len(ttfts) if ttfts else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p90_s=percentile(ttfts, 90),
        ttft_p99_s=percentile(ttfts, 99),
        decode_tps=decode_tokens / decode_time if decode_time > 0 else 0.0,
        wall_s=wall_s,
        skipped_too_long=sum(s.reason == SKIP_TOO_LONG for s in skipped),
        skipped_kv_full=sum(s.reason == SKIP_KV_FULL for s in skipped),
        interrupted=interrupted,
        **info,
    )


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0
