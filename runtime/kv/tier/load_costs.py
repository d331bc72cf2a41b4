"""What the tiers count and measure: `TierCounters` (per-tier counters since the engine started) and `LoadCosts`
(moving averages of the prefill cost per token and of each tier's load cost per page, which decide whether a page
found below the device is loaded or recomputed). Plain Python, no torch."""

from __future__ import annotations

from dataclasses import dataclass

_EMA = 0.2  # weight of the newest measurement in the cost averages


@dataclass(frozen=True, slots=True)
class TierCounters:
    """Per-tier counters since the engine started. *_hit_tokens: prompt tokens of fresh requests served from each
    tier (device: matched in the tree; host, disk: loaded back). *_loaded_pages: pages copied up (resumptions too).
    declined_pages: pages found below the device but recomputed because that was cheaper. disk_failed_reads: pages
    listed on disk whose file failed its checks (deleted, recomputed). host_saved_pages: pages copied to the host.
    host_failed_copies: copies to or from the host that raised (pages not cached there, or recomputed).
    disk_queued_pages / disk_dropped_pages: page writes handed to the disk writer, or dropped (queue full,
    tier disabled)."""

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


class LoadCosts:
    """Measured costs, as moving averages: seconds of prefill per token, seconds to load a page from each tier.

    A tier's pages are loaded when `pages * load_per_page < pages * page_size * prefill_per_token`. Until both sides
    are measured, loading is assumed cheaper (the first load measures it). `mode` "always" or "never" overrides the
    comparison (benchmarks and tests that need a fixed choice; "never" leaves the tiers to fill but not serve)."""

    MODES = ("auto", "always", "never")

    def __init__(self, mode: str = "auto") -> None:
        if mode not in self.MODES:
            raise ValueError(f"load_back must be one of {', '.join(self.MODES)}, got {mode!r}")
        self.mode = mode
        self.prefill_s_per_token: float | None = None
        self.load_s_per_page: dict[str, float] = {}

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def note_load(self, tier: str, pages: int, seconds: float) -> None:
        if pages > 0:
            self.load_s_per_page[tier] = _ema(self.load_s_per_page.get(tier), seconds / pages)

    def worth_loading(self, tier: str, page_size: int) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        load, prefill = self.load_s_per_page.get(tier), self.prefill_s_per_token
        return load is None or prefill is None or load < page_size * prefill


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new
