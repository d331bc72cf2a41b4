"""The simulator: a user of the core, like the runtime, and never imported by it.

It replays workloads (`radixcache.trace`) through the tree with no model and no tensors: eviction policies and
their offline bounds (Belady and its oracles), lower tiers and their costs, routing across replicas, sweeps and
comparisons. Import what you need from its modules (`radixcache.sim.simulate`, `radixcache.sim.routing`, ...).
"""
