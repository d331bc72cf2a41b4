"""The runtime's import paths from before its tiers gathered in kv/tier/, the queue bound took its own name and the
prompt's byte bound moved below the engine (loading/prompt_bound.py), which refuses an over-long text too.

`import radixcache.runtime` installs these with radixcache.moved's finder: the old path imports, with a
DeprecationWarning naming the new home, and offers every name it had.
"""

from __future__ import annotations

#: old module -> its new homes, searched in order for each name
RUNTIME_MOVED: dict[str, tuple[str, ...]] = {
    "radixcache.runtime.engine.admission": ("radixcache.runtime.engine.queue_limit",),
    "radixcache.runtime.kv.tiering": ("radixcache.runtime.kv.tier.coordinator", "radixcache.runtime.kv.tier.build"),
    "radixcache.runtime.kv.disk": (
        "radixcache.runtime.kv.tier.disk_store",
        "radixcache.runtime.kv.tier.disk_layout",
        "radixcache.runtime.kv.tier.disk_index",
        "radixcache.runtime.kv.tier.disk_writer",
        "radixcache.runtime.kv.tier.disk_reports",
    ),
    "radixcache.runtime.kv.disk_format": ("radixcache.runtime.kv.tier.disk_format",),
    "radixcache.runtime.kv.fingerprint": ("radixcache.runtime.kv.tier.fingerprint",),
    "radixcache.runtime.kv.host_pool": ("radixcache.runtime.kv.tier.host_pool",),
    "radixcache.runtime.server.prompt_bound": ("radixcache.runtime.loading.prompt_bound",),
}
