"""Benchmark the page tiers' LRU bookkeeping (radixcache.tier.page_tier.PageTier over radixcache.tier.recency's
RecencyOrder) against PageTier at other git revisions, among them the OrderedDict it replaced (c80547a^), on the
calls the simulator's tiered replay of a trace makes of its tiers (the Mooncake trace with 8,000 device, 20,000 host
and 40,000 disk blocks by default, as docs/simulator.md's tiers table).

    .venv/bin/python scripts/bench_page_tier.py --rev HEAD --rev c80547a^        # 5 interleaved rounds
    .venv/bin/python scripts/bench_page_tier.py --rounds 9 --trace T.jsonl --rev c80547a^

The replay runs once, recording every call of its tiers (store, touch, count_prefix, lock, unlock, discard); each
round then plays those calls on fresh tiers of each class in turn (interleaved: the machine's speed moves between
minutes) and times them in CPU time (time.process_time: other processes on a shared machine count less than in wall
time). A PageTier from before runs arrived over several commits (c80547a^) takes no `older_than`: its stores place
each page newest, a little less work than the order asked for. Prints each round, the medians and the ratios.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from script_args import at_least  # noqa: E402

# The simulator and the trace reader are imported where they are used, after the arguments are checked: a bad count
# is refused at once, not after the seconds they take to import.

DEFAULT_TRACE = Path("../shared/traces/mooncake_synthetic_trace.jsonl")  # from the checkout, as the docs run it


def tier_class(rev: str | None) -> type:
    """PageTier of this checkout (`rev` None), or as it was at git revision `rev`: its page_tier.py (and recency.py,
    where that revision has one) loaded as fresh modules, beside this checkout's."""
    from radixcache.tier import page_tier

    if rev is None:
        return page_tier.PageTier

    def source(path: str) -> str | None:
        got = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, text=True)
        return got.stdout if got.returncode == 0 else None

    saved = sys.modules.get("radixcache.tier.recency")
    try:
        recency_src = source("radixcache/tier/recency.py")
        if recency_src is not None:
            recency = types.ModuleType(f"recency_at_{rev}")
            exec(compile(recency_src, f"{rev}:recency.py", "exec"), recency.__dict__)
            sys.modules["radixcache.tier.recency"] = recency  # what that page_tier.py imports
        tier_src = source("radixcache/tier/page_tier.py")
        if tier_src is None:
            raise SystemExit(f"no radixcache/tier/page_tier.py at {rev}")
        module = sys.modules[f"page_tier_at_{rev}"] = types.ModuleType(f"page_tier_at_{rev}")  # for its dataclass
        exec(compile(tier_src, f"{rev}:page_tier.py", "exec"), module.__dict__)
    finally:
        if saved is not None:
            sys.modules["radixcache.tier.recency"] = saved
    return module.PageTier


CALLS = ("store", "touch", "count_prefix", "lock", "unlock", "discard")  # what a replay asks of a tier


def recorder(log: list[tuple[str, int, tuple]], sizes: list[tuple[int, str]]) -> type:
    """A PageTier class that appends each call a replay makes of it to `log` (method, tier index, arguments) and
    each tier's size and name to `sizes`, to be played again alone (`play`)."""
    from radixcache.tier import page_tier

    class Recorder(page_tier.PageTier):
        def __init__(self, capacity: int, **kw) -> None:
            super().__init__(capacity, **kw)
            self.tier_id = len(sizes)
            sizes.append((capacity, kw.get("name", "host")))

    for name in CALLS:

        def logged(self, *args, _name=name):  # type: ignore[no-untyped-def]
            log.append((_name, self.tier_id, tuple(list(a) if isinstance(a, list) else a for a in args)))
            return getattr(page_tier.PageTier, _name)(self, *args)

        setattr(Recorder, name, logged)
    return Recorder


def record(workload, args: argparse.Namespace) -> tuple[list[tuple[str, int, tuple]], list[tuple[int, str]]]:
    """The calls a tiered replay makes of its PageTiers, in order, and the tiers' sizes and names."""
    from radixcache.sim import TierConfig, evaluate
    from radixcache.sim import tiers as sim_tiers

    log: list[tuple[str, int, tuple]] = []
    sizes: list[tuple[int, str]] = []
    real = sim_tiers.PageTier
    sim_tiers.PageTier = recorder(log, sizes)  # type: ignore[misc]  # the tiers made in this replay record
    try:
        tiers = TierConfig(host_capacity_blocks=args.host_blocks, disk_capacity_blocks=args.disk_blocks)
        evaluate(workload, args.capacity_blocks, tiers=tiers, infinite=False)
    finally:
        sim_tiers.PageTier = real  # type: ignore[misc]
    return log, sizes


def play(log: list[tuple[str, int, tuple]], sizes: list[tuple[int, str]], tier: type) -> tuple[float, int]:
    """(CPU seconds, pages held at the end) of the recorded calls played on fresh tiers of class `tier`."""
    tiers = [tier(capacity, name=name) for capacity, name in sizes]
    takes_parent = "older_than" in inspect.signature(tier.store).parameters
    calls = []
    for name, t, a in log:
        if name == "store" and not takes_parent:  # a PageTier from before runs arrived over commits
            a = a[:1]
        calls.append((getattr(tiers[t], name), a))
    t0 = time.process_time()
    for method, a in calls:
        method(*a)
    seconds = time.process_time() - t0
    return seconds, sum(len(t) for t in tiers)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--rounds", type=at_least(1), default=5)
    ap.add_argument("--capacity-blocks", type=at_least(1), default=8000)
    ap.add_argument("--host-blocks", type=at_least(1), default=20000)
    ap.add_argument("--disk-blocks", type=at_least(1), default=40000)
    ap.add_argument("--rev", action="append", default=[], help="also time PageTier at this git revision (repeatable)")
    args = ap.parse_args(argv)
    if not args.trace.is_file():  # a usage error naming it, not a TraceError traceback from the reader
        ap.error(f"argument --trace: no such trace file: {args.trace}")
    from radixcache.errors import RadixCacheError
    from radixcache.trace.workload import load_workload

    try:
        workload = load_workload(str(args.trace))
    except RadixCacheError as exc:
        ap.error(f"argument --trace: {exc}")
    log, sizes = record(workload, args)
    print(f"{len(log):,} calls of {len(sizes)} tiers recorded from the replay", flush=True)
    classes = {"this checkout": tier_class(None)} | {f"at {rev}": tier_class(rev) for rev in args.rev}
    times: dict[str, list[float]] = {name: [] for name in classes}
    for r in range(args.rounds):
        for name, tier in classes.items():
            seconds, held = play(log, sizes, tier)
            times[name].append(seconds)
            print(f"round {r + 1}: {name:24s} {seconds:6.3f} s CPU, {held:,} pages held at the end", flush=True)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in medians.items():
        print(f"median {name:24s} {m:6.3f} s")
    here = medians["this checkout"]
    for name, m in medians.items():
        if name != "this checkout":
            print(f"this checkout / {name}: {here / m:.2f}x")


if __name__ == "__main__":
    main()
