"""The scheduler's settings (engine.scheduler), checked once when they are built."""

from __future__ import annotations

from dataclasses import dataclass

from radixcache.runtime.engine.prefill_budget import check_attention_bound

SCHEDULES = ("lpm", "fcfs", "dfs-weight")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """schedule: lpm | fcfs | dfs-weight. max_prefill_tokens: prompt tokens per step while nothing decodes.
    mixed_prefill_tokens: prompt tokens per step while requests decode (bounds their stall). max_prefill_seqs:
    requests whose chunks share one pass (1: one at a time). prefill_chunk: most tokens of one request per pass.
    max_running: most requests admitted at once (the decode batch). mixed_prefill_attention: the most attention
    work (query tokens x positions attended) of a step's chunks while requests decode (None: no bound; see
    engine.prefill_budget). staged_prefill_attention: while requests decode, a chunk of more attention work runs its
    layers over several passes (None: never; model.staged). max_wait_steps / max_wait_s: starvation guard.
    in_batch_sharing: defer a request sharing an uncached prefix with one being prefilled (cache-aware schedules
    only; fcfs is the plain baseline).
    share_in_flight: commit pages to the tree as they are computed (False: only when a request leaves)."""

    schedule: str = "lpm"
    max_prefill_tokens: int = 1024
    mixed_prefill_tokens: int = 24
    mixed_prefill_attention: int | None = None
    staged_prefill_attention: int | None = None
    max_prefill_seqs: int = 16
    prefill_chunk: int = 512
    max_running: int = 64
    max_wait_steps: int = 64
    max_wait_s: float = 10.0
    in_batch_sharing: bool = True
    share_in_flight: bool = True

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("max_prefill_tokens", "mixed_prefill_tokens", "max_prefill_seqs", "prefill_chunk", "max_running"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        # Read at every admission: a wrong kind failed every request of every step (a TypeError from the compare)
        if isinstance(self.max_wait_steps, bool) or not isinstance(self.max_wait_steps, int) or self.max_wait_steps < 0:
            raise ValueError(f"max_wait_steps must be an int >= 0, got {self.max_wait_steps!r}")
        wait_s = self.max_wait_s
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s >= 0:  # NaN: never
            raise ValueError(f"max_wait_s must be a number of seconds >= 0 (inf: no bound), got {wait_s!r}")
        for flag in ("in_batch_sharing", "share_in_flight"):  # "no" read as true
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        check_attention_bound(self.mixed_prefill_attention)
        check_attention_bound(self.staged_prefill_attention, "staged_prefill_attention")
