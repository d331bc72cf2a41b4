"""Every policy and both Belady bounds on one trace at one capacity, in one table (`simulate --policies all`).

The online policies (and, with `admission`, each of them under that admission policy) and the infinite cache are
fed in one pass over the trace; each offline bound reads it once more for its oracle, then replays.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixcache.errors import RadixCacheError
from radixcache.policy.admission import AdmissionPolicy
from radixcache.policy.registry import ALL_POLICIES
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.infinite_replay import InfiniteReplay
from radixcache.sim.replay_common import Replayable, drive, trace_span
from radixcache.sim.results import BELADY, BELADY_ADMISSION, SimResult, bound_label
from radixcache.sim.simulation import simulate, simulate_infinite

#: the offline runs `--policies all` adds, in table order
BOUNDS = (BELADY, BELADY_ADMISSION)


@dataclass(frozen=True, slots=True)
class ComparedRun:
    """One row: a policy (`kind` "policy"), an offline bound ("bound") or the infinite cache ("infinite")."""

    name: str
    kind: str
    label: str
    result: SimResult

    def as_dict(self) -> dict:
        r = self.result
        return {
            "name": self.name,
            "kind": self.kind,
            "label": self.label,
            "hit_rate": r.hit_rate,
            "block_hit_rate": r.block_hit_rate,
            "hit_tokens": r.hit_tokens,
            "evicted_blocks": r.evicted_blocks,
            "declined_pages": r.declined_pages,
            "seconds": r.seconds,
            "clock": r.clock,
        }


def policy_names(spec: str) -> list[str]:
    """The policies a `--policies` value names: "all", or names separated by commas."""
    if spec.strip().lower() == "all":
        return sorted(ALL_POLICIES)
    names = [name.strip().lower() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALL_POLICIES]
    if unknown or not names:
        raise RadixCacheError(
            f"--policies: unknown policy {unknown[0] if unknown else spec!r}; give 'all' or names from "
            f"{', '.join(sorted(ALL_POLICIES))} separated by commas"
        )
    return list(dict.fromkeys(names))


def compare(
    workload: Replayable,
    capacity_blocks: int,
    policies: Sequence[str],
    *,
    concurrency: int = 1,
    admission: str | AdmissionPolicy | None = None,
    bounds: Sequence[str] = BOUNDS,
    infinite: bool = True,
    progress: Callable[[int], None] | None = None,
    honor_timestamps: bool = False,
) -> list[ComparedRun]:
    """Replay `workload` under each of `policies` (each with `admission` too, when given), the offline `bounds`
    and the infinite cache; rows in that order. A `reuse` admission needs the `reuse` policy: it is run only
    beside that one; an AdmissionPolicy object is copied for each replay. `honor_timestamps`: the caches' clocks
    follow the trace's timestamps (see `simulate`)."""
    for what, names in (("policies", policies), ("bounds", bounds)):
        if isinstance(names, str):  # its letters were taken for names: "unknown eviction policy 'l'"
            raise RadixCacheError(
                f"{what} must be a list of names, got the string {names!r} (policy_names reads a comma list)"
            )
    clock = {"honor_timestamps": honor_timestamps}
    if isinstance(admission, str):  # any case, as make_admission takes it ("REUSE" ran beside every policy)
        admission = admission.lower()
    replays: list[tuple[str, CacheReplay]] = []
    # Names in any case, as make_policy takes them: "REUSE" ran without its reuse admission (compared as "reuse").
    for name in (name.lower() if isinstance(name, str) else name for name in policies):
        # A policy object serves one cache (policy.base.claim): the admission's replay gets a copy, taken before the
        # first replay claims it (a copy of a claimed object is claimed too).
        twin = name if isinstance(name, str) else copy.deepcopy(name)
        replays.append(
            (name, CacheReplay(workload, capacity_blocks, name, concurrency=concurrency, windows=1, **clock))
        )
        if admission is not None and (admission != "reuse" or name == "reuse"):
            # An admission object is copied for each replay: one shared by every policy's replay would carry what
            # it learned (counts, classes) from one replay into the next, and no row would be that policy's alone.
            own = admission if isinstance(admission, str) else copy.deepcopy(admission)
            replay = CacheReplay(
                workload, capacity_blocks, twin, concurrency=concurrency, windows=1, admission=own, **clock
            )
            replays.append((f"{name} + admission {replay.admission.name}", replay))  # type: ignore[union-attr]
    unbounded = InfiniteReplay(workload, concurrency=concurrency, windows=1, span=trace_span(workload))
    feeds: list = [replay for _, replay in replays]
    drive(workload, [*feeds, unbounded] if infinite else feeds, progress)
    rows = [ComparedRun(name, "policy", name, replay.result()) for name, replay in replays]
    for bound in bounds:
        result = simulate(workload, capacity_blocks, bound, concurrency=concurrency, windows=1, **clock)
        rows.append(ComparedRun(bound, "bound", bound_label(bound, result.in_flight), result))
    if infinite:
        result = (
            simulate_infinite(workload, concurrency=concurrency, windows=1) if unbounded.broken else unbounded.result()
        )
        rows.append(ComparedRun("infinite", "infinite", "bound: infinite cache", result))
    return rows
