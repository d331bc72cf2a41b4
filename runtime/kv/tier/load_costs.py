"""What the tiers count and measure: `TierCounters` (per-tier counters since the engine started) and `LoadCosts`
(the measured prefill cost per token and each tier's load cost per page, which decide whether a page found below
the device is loaded or recomputed). Plain Python, no torch."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

_EMA = 0.2  # weight of the newest measurement in the prefill cost's average


@dataclass(frozen=True, slots=True)
class TierCounters:
    """Per-tier counters since the engine started. *_hit_tokens: prompt tokens of fresh requests served from each
    tier (device: matched in the tree; host, disk: loaded back). *_loaded_pages: pages copied up (resumptions too).
    declined_pages: pages found below the device but recomputed because that was cheaper. disk_failed_reads: disk
    reads that failed, not pages: one per request's read that met a page missing, failing its checks (deleted) or
    raising, which ends the read there (that page and the run's later ones are recomputed, uncounted), or whose copy
    into the pool raised. host_saved_pages: pages copied to the host.
    host_failed_copies: copies to or from the host that raised (pages not cached there, or recomputed).
    disk_queued_pages / disk_dropped_pages: page writes handed to the disk writer, and those dropped (queue full,
    tier disabled, or by the writer: a write that failed, a run's page before it gone, discarded at a close or a
    clear; these were counted queued too)."""

    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    disk_hit_tokens: int = 0
    host_loaded_pages: int = 0
    disk_loaded_pages: int = 0
    declined_pages: int = 0
    disk_failed_reads: int = 0
    host_saved_pages: int = 0
    host_failed_copies: int = 0
    disk_queued_pages: int = 0
    disk_dropped_pages: int = 0


class TierTally(dict[str, int]):
    """The running counts behind TierCounters (one per field, from 0), which the coordinator moves as pages do."""

    def __init__(self) -> None:
        super().__init__(dict.fromkeys(TierCounters.__slots__, 0))

    def hits(self, matched: int, device_pages: int, host_pages: int, page_size: int) -> None:
        """An admission's `matched` cached tokens by tier: its first `device_pages` pages were on the device, the
        next `host_pages` on the host, the rest on disk (the last token's cut taken from the deepest)."""
        device = min(matched, device_pages * page_size)
        host = min(matched - device, host_pages * page_size)
        self["device_hit_tokens"] += device
        self["host_hit_tokens"] += host
        self["disk_hit_tokens"] += matched - device - host

    def failed_deferred_load(self, pages: int, hit_tokens: int) -> None:
        """A deferred disk load whose copy raised: its `pages`, counted loaded, and its `hit_tokens`, counted disk
        hits, are recomputed instead (a failed read)."""
        self["disk_failed_reads"] += 1
        self["disk_loaded_pages"] -= pages
        self["disk_hit_tokens"] -= hit_tokens


@dataclass(slots=True)
class _TierCost:
    """One tier's load measurements: the seconds per page of its last WINDOW loads (their median, the lower middle
    one of an even count, is the tier's cost: one hiccup among them moves nothing), how many loads were measured,
    and the probe schedule."""

    recent: deque[float]
    probe_after: int  # declines before the next decision loads anyway, to measure again
    samples: int = 0
    declines: int = 0  # decisions that declined this tier since its last measured load
    probing: bool = False  # a decision loaded to measure again; its load is the next one measured

    @property
    def per_page(self) -> float:
        return statistics.median_low(self.recent)


class LoadCosts:
    """Measured costs: seconds of prefill per token (a moving average), seconds per page of each tier's loads (the
    median of its last WINDOW loads).

    A tier's pages are loaded when `load_per_page < page_size * prefill_per_token` (`page_size`: tokens a page holds).
    Until both sides are measured, and until a tier's loads were measured `MIN_SAMPLES` times, loading is assumed
    cheaper: one slow load (a cold file, a busy moment) must not switch a tier off, and the median keeps one from
    deciding later too. A tier measured dearer is still loaded once every `probe_after` declines, to measure again (a
    probe). The probe's measurement replaces the tier's window (it is that many decisions old; while a tier is loaded
    every load enters it, so a probe that measured it cheaper by chance is outvoted by the loads that follow).
    `probe_after` starts at `PROBE_FIRST`, doubles after each probe that finds the tier still dearer, up to `PROBE_MAX`,
    and starts again once a load measures cheaper. So a tier that is really dearer costs at most one request in
    `PROBE_MAX` (after the first few probes), and a tier misjudged in a passing hiccup comes back at its next probe
    instead of never.

    `worth_loading` only asks (the prefetch planner asks it at every loop pass); `choose` is the decision at a
    request's admission, counted. `mode` "always" or "never" overrides the comparison (benchmarks and tests that
    need a fixed choice; "never" leaves the tiers to fill but not serve)."""

    MODES = ("auto", "always", "never")
    MIN_SAMPLES = 3
    WINDOW = 5
    PROBE_FIRST = 8
    PROBE_MAX = 256

    def __init__(self, mode: str = "auto", page_size: int = 1) -> None:
        if mode not in self.MODES:
            raise ValueError(f"load_back must be one of {', '.join(self.MODES)}, got {mode!r}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.mode = mode
        self.page_size = page_size
        self.prefill_s_per_token: float | None = None
        self._tiers: dict[str, _TierCost] = {}

    def load_s_per_page(self, tier: str) -> float | None:
        """The measured seconds per page of a tier's loads, or None before its first measured load."""
        cost = self._tiers.get(tier)
        return None if cost is None else cost.per_page

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def note_load(self, tier: str, pages: int, seconds: float) -> None:
        if pages <= 0:
            return
        cost = self._tiers.get(tier)
        if cost is None:
            cost = self._tiers[tier] = _TierCost(deque(maxlen=self.WINDOW), probe_after=self.PROBE_FIRST)
        if cost.probing:  # the window is at least probe_after decisions old: the probe's measurement replaces it
            cost.recent.clear()
        cost.recent.append(seconds / pages)
        cost.samples += 1
        was_probe, cost.probing, cost.declines = cost.probing, False, 0
        if self._cheaper(cost):
            cost.probe_after = self.PROBE_FIRST
        elif was_probe:
            cost.probe_after = min(2 * cost.probe_after, self.PROBE_MAX)

    def worth_loading(self, tier: str) -> bool:
        """Whether a request admitted now would load this tier's pages (changes nothing)."""
        if self.mode != "auto":
            return self.mode == "always"
        cost = self._tiers.get(tier)
        return cost is None or self._cheaper(cost) or cost.declines >= cost.probe_after

    def choose(self, tier: str) -> bool:
        """The decision for a request being admitted with pages on this tier: load them (True) or recompute them.
        Counts a decline, and starts a probe when one is due."""
        load = self.worth_loading(tier)
        cost = self._tiers.get(tier)
        if self.mode != "auto" or cost is None or self._cheaper(cost):
            return load
        if load:  # a probe: declines count again from here (a probe whose load fails is followed by another)
            cost.probing, cost.declines = True, 0
        else:
            cost.declines += 1
        return load

    def _cheaper(self, cost: _TierCost) -> bool:
        """Loading counts as cheaper while prefill is unmeasured or the tier has fewer than MIN_SAMPLES loads."""
        prefill = self.prefill_s_per_token
        if prefill is None or cost.samples < self.MIN_SAMPLES:
            return True
        return cost.per_page < self.page_size * prefill


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new
