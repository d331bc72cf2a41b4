"""The tiers under the device pool, as bytes: host pages in RAM, page files on disk, and what moves them.

Where each part of the tiers lives:
- the policy (which pages are where, when they go down, what a prompt matches below the device) is the torch-free
  radixcache.tier: `TieredCache` over a `PageTier` of host slots, shared with the simulator;
- the simulator's prices for the same moves (`TierCosts`: per-page load costs, the modelled TTFT) are
  radixcache.sim.tiers, whose defaults scripts/bench_tiers.py measured on this package;
- the bytes are here: `host_pool` (the host tier's pages, pinned on CUDA), `copy_sync` (the device-free decisions
  behind the CUDA-only paths: what is pinned, which stream waits for which, when a host slot is free again),
  `disk_format` (one page file), `disk_*` (the disk store: its directory, index, writer and front, `disk_store`),
  `fingerprint` (what a disk page's hash root covers), `prefetch` (reader threads that read a waiting request's
  disk pages into staging memory; `prefetch_policy` names the policies that say when it is admitted), `page_copy`
  (pages copied in runs of slice copies), `load_costs` (the per-tier counters and measured load costs), and
  `coordinator` (`KVTiers`, the one object the KV manager calls: match, plan, prefetch, load back, send adopted
  pages down).

Nothing here imports the KV manager: the package imports only `kv.pool`, `runtime.config` and the library below
it. The disk store's modules (`disk_*`), `copy_sync` and `prefetch_policy` import no torch, and this file imports
nothing, so `radixcache cache` reads cache directories (and the CLI builds its options) without loading torch.
"""
