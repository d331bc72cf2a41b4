"""What a replay of one cache reports: its figures (`SimResult`), their time windows (`Window`), the figures with
their bounds (`SimReport`), and the names and labels of the offline bounds.

Plain frozen data, so that the CLI, the sweeps and the comparisons read a replay's figures without importing a replay.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixcache.sim.tiers import TierResult

BELADY = "belady"  # Belady's optimum when every page of a running request must be cached (resident)
BELADY_ADMISSION = "belady-admission"  # Belady's optimum when a request's pages may skip the cache (admission)
DEAD_LRU = "lru-dead"  # LRU that knows which blocks are never read again: a diagnostic bound
ORACLE_POLICIES = (BELADY, BELADY_ADMISSION, DEAD_LRU)
#: what each offline run bounds, as the CLI, the JSON and the docs name it: compare a policy without admission
#: with the resident bound, and one with admission with the admission bound
BOUND_LABELS = {
    BELADY: "bound: Belady, resident",
    BELADY_ADMISSION: "bound: Belady with admission",
    DEAD_LRU: "diagnostic: LRU told the dead blocks",
}
#: what the CLI says of a Belady run with requests in flight, where it is no bound (`bound_label`)
IN_FLIGHT_NOTE = (
    "Belady is the optimum one request at a time only; with requests in flight an online policy can beat it"
)


def bound_label(bound: str, in_flight: bool) -> str:
    """BOUND_LABELS[bound] one request at a time. With requests `in_flight` together (SimResult.in_flight) a Belady
    run is a heuristic, not a bound: a request's pages join the tree only when it finishes, so an online policy can
    beat the farthest next read (docs/simulator.md)."""
    label = BOUND_LABELS[bound]
    if in_flight and bound in (BELADY, BELADY_ADMISSION):
        return label.replace("bound: ", "heuristic: ") + " (requests in flight: not a bound)"
    return label


@dataclass(frozen=True, slots=True)
class Window:
    """Requests that arrived in [start_ms, end_ms), and what they hit."""

    start_ms: float
    end_ms: float
    requests: int
    prompt_tokens: int
    hit_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def window_dict(w: Window) -> dict:
    """A window as `simulate --json` writes it: its tokens (so windows can be merged), and its hit rate, null where
    no prompt token arrived (the table's `-`; 0.0 read as a cold cache in an idle gap)."""
    return {
        "start_ms": w.start_ms,
        "end_ms": w.end_ms,
        "requests": w.requests,
        "prompt_tokens": w.prompt_tokens,
        "hit_tokens": w.hit_tokens,
        "hit_rate": w.hit_rate if w.prompt_tokens else None,
    }


@dataclass(frozen=True, slots=True)
class SimResult:
    """One replay. Tokens are real prompt tokens; blocks are cache blocks (pages, or trace hash blocks)."""

    policy: str
    capacity_blocks: int
    page_size: int
    block_tokens: int
    concurrency: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    prompt_blocks: int
    hit_blocks: int
    evicted_blocks: int
    oversized_requests: int  # requests that needed more blocks than the cache could free; cached in part
    windows: tuple[Window, ...]
    seconds: float
    tiers: TierResult | None = None  # a tiered replay's (TieredReplay): per-tier hits and modelled TTFT
    admission: str | None = None  # the admission policy's name, when one decided what the tree adopts
    declined_pages: int = 0  # pages the admission policy kept out of the tree
    # The cache's clock: "requests" ticks once per match or insert; "timestamps" follows the trace's arrival times
    # (microseconds; `honor_timestamps`), so a policy that measures intervals (`reuse`) measures time.
    clock: str = "requests"
    # Requests were in flight together (concurrency above 1, or a recorded trace's finish times): Belady is no bound.
    in_flight: bool = False

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens (over every tier, for a tiered replay)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        """Hit blocks over prompt blocks (a prompt's partial last page counts as a block that can miss)."""
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0


@dataclass(frozen=True, slots=True)
class SimReport:
    """A replay with its bounds: the same trace through an infinite cache (None when not asked for), and through
    Belady's optimum."""

    result: SimResult
    infinite: SimResult | None
    belady: SimResult | None = None  # the resident bound (BELADY)
    belady_admission: SimResult | None = None  # the admission bound (BELADY_ADMISSION)

    def as_dict(self) -> dict:
        """The machine-readable summary (the keys of `radixcache simulate --json`)."""
        r = self.result
        out = {
            "policy": r.policy,
            "capacity_blocks": r.capacity_blocks,
            "block_tokens": r.block_tokens,
            "concurrency": r.concurrency,
            "requests": r.requests,
            "prompt_tokens": r.prompt_tokens,
            "hit_tokens": r.hit_tokens,
            "hit_rate": r.hit_rate,
            "block_hit_rate": r.block_hit_rate,
            "evicted_blocks": r.evicted_blocks,
            "oversized_requests": r.oversized_requests,
            "windows": [window_dict(w) for w in r.windows],
            "seconds": r.seconds,
            "clock": r.clock,
        }
        if self.infinite is not None:
            out["infinite_hit_rate"] = self.infinite.hit_rate
            out["infinite_block_hit_rate"] = self.infinite.block_hit_rate
        if r.admission is not None:
            out["admission"] = r.admission
            out["declined_pages"] = r.declined_pages
        bounds = {}
        if self.belady is not None:  # the resident bound keeps its old keys
            out["belady_hit_rate"] = self.belady.hit_rate
            out["belady_block_hit_rate"] = self.belady.block_hit_rate
            bounds[BELADY] = bound_label(BELADY, self.belady.in_flight)
        if self.belady_admission is not None:
            out["belady_admission_hit_rate"] = self.belady_admission.hit_rate
            out["belady_admission_block_hit_rate"] = self.belady_admission.block_hit_rate
            bounds[BELADY_ADMISSION] = bound_label(BELADY_ADMISSION, self.belady_admission.in_flight)
        if bounds:
            out["bounds"] = bounds
        if r.tiers is not None:
            out.update(r.tiers.as_dict())
        return out
