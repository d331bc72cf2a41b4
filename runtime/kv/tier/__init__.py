"""The tiers under the device pool, as bytes: host pages in RAM, page files on disk, and what moves them.

Where each part of the tiers lives:
- the policy (which pages are where, when they go down, what a prompt matches below the device) is the torch-free
  radixcache.tier: `TieredCache` over a `PageTier` of host slots, shared with the simulator;
- the simulator's prices for the same moves (per-page load and copy costs) are radixcache.sim.tiers;
- the bytes are here: `host_pool` (the host tier's pages, pinned on CUDA), `cuda_copy` (the device-free decisions
  behind the CUDA-only paths: what is pinned, which stream waits for which, when a host slot is free again),
  `disk_format` (one page file), `disk_*` (the disk store: its directory, index, writer and front, `disk_store`),
  `fingerprint` (what a disk page's hash root covers), and `coordinator` (`KVTiers`, the one object the KV manager
  calls: match, plan, load back, send adopted pages down, per-tier counters).

Nothing here imports the KV manager; the package imports only `kv.pool` and the library below it. Importing
this package (or the disk store's modules) loads no torch: `radixcache cache` reads cache directories without it.
"""
