"""The simulator: a user of the core, like the runtime, and never imported by it.

Inside this package, a *replay* is a workload replayed through a simulated tree (or a table that stands in for
one): no model, no tensors, requests matched, locked, allocated and inserted as an engine would, in arrival order.
It replays workloads (`radixcache.trace`) under eviction policies and their offline bounds (Belady and its oracles),
with lower tiers and their costs, and across replicas behind a router; sweeps and comparisons run many replays.

One replay of one cache:
    simulation          `simulate`, `simulate_infinite`: run one replay and return its SimResult
    evaluation          `evaluate`: a policy's replay with its bounds (infinite cache, Belady), as a SimReport
    results             SimResult, SimReport, Window; the names and labels of the offline bounds
    cache_replay        CacheReplay: through a RadixCache, with an eviction policy or an oracle, and admission
    tiered_replay       TieredReplay: through a device cache with host and disk tiers under it
    infinite_replay     InfiniteReplay: through a cache that never evicts, kept as a table
    flat, flat_lru      Belady and LRU over single blocks, with the tree's figures in a fraction of the time
    replay_common       what the replays share (the pass that feeds them, the SimResult their counters make)
    timeline            the hit rate per window of arrival time
    belady, oracle      Belady's policy and the next-use oracles behind it
    tiers               the tiers' configuration, cost model and modelled TTFT
    source, read_ahead  a trace streamed from its file, read ahead in another process
    inflight, prefixes, infinite_ids, packing, fork   the requests in flight, and the replays' other helpers
Many replicas behind a router:
    routing_replay      `simulate_routing`, RoutingReplay: a workload through N replicas with a FIFO queueing model
    routing_replicas    one simulated replica and a request in flight on it
    routing_workload    the routed requests (with the tokens they decode) and their arrival times
    routing_results     RoutingResult and what it holds; RoutingCosts
Many replays:
    compare             every policy and both Belady bounds on one trace (`simulate --policies`)
    sweep, routing_cells   the eviction and routing sweeps' cells; cell_pool runs them on processes or Ray

The public entry points are re-exported here for users. Modules of this package import from the module that
defines a name, never from the package.
"""

from radixcache.sim.evaluation import evaluate
from radixcache.sim.results import BELADY, BELADY_ADMISSION, BOUND_LABELS, DEAD_LRU, SimReport, SimResult, Window
from radixcache.sim.routing_replay import RoutingReplay, simulate_routing
from radixcache.sim.routing_results import RoutingCosts, RoutingResult
from radixcache.sim.simulation import simulate, simulate_infinite
from radixcache.sim.source import TraceSource, open_source
from radixcache.sim.tiers import TierConfig, TierCosts

__all__ = [
    "BELADY",
    "BELADY_ADMISSION",
    "BOUND_LABELS",
    "DEAD_LRU",
    "RoutingCosts",
    "RoutingReplay",
    "RoutingResult",
    "SimReport",
    "SimResult",
    "TierConfig",
    "TierCosts",
    "TraceSource",
    "Window",
    "evaluate",
    "open_source",
    "simulate",
    "simulate_infinite",
    "simulate_routing",
]
