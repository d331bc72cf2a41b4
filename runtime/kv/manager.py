"""The engine's only door to the radix cache: a request's KV pages from admission to release.

match and lock -> allocate -> commit each computed chunk (in flight) -> grow while decoding -> release.

Every method leaves the cache's invariants true, also when it raises: a request either holds its lock and blocks
(RUNNING) or holds nothing (WAITING, FINISHED, ABORTED). A tier copy or an event publish that raises while the tree
adopts pages is held until the commit, release or preemption under way has finished, then raised. A request's
pages, lock and accounting are one `KVState` (kv.state) that the engine creates and this manager mutates; each
method takes that state and plain values (the request's token ids so far), never the engine's Request, so `kv/`
imports nothing of `engine/`.

In-flight sharing: `commit` gives the tree a running request's computed full pages as soon as a forward pass wrote
them (each prefill chunk, each page a decode fills), still locked by the request. Another request that arrives
meanwhile matches them like any cached prefix. A page that another request inserted first replaces our duplicate
(the tree frees ours) and the request's block table follows the tree. Preemption gives a running request's
computed KV to the tree (evictable, so that its resumption hits it if it survives) and puts it back to WAITING.

Admission (radixcache.policy.admission): the tree adopts a request's pages only up to its `admit_limit`, the policy's
answer, asked once per request, the first time its pages would go to the tree (its first commit, or its give-back,
with the known total when it finished) and kept across preemptions. Pages past the limit stay the request's own
blocks: it reads them while it runs, and they are freed when it leaves (a preempted request recomputes them). Pages
already in the tree are never taken back, and only adopted pages go down the tiers and to the event log.
`AdmitAll` (the default) adopts every page: the behaviour without admission control.

Leases (kv.leases): a request that finishes with `retain_for` seconds takes a lease on the pages the tree holds of
it; each admission renews the leases its match reaches, and leases past their deadline are released before
anything here allocates (and so evicts). When an admission or a decode's next page cannot be found, the oldest
leases give way first: a lease never fails a request.

The last token: its pass makes the next token's logits, so at most all tokens but the last count as cached. A match
that reaches it (the same prompt again, a parallel sample) keeps that token's page: a tier page is loaded into a
block of the request's own as usual, a tree page copied into one (`copy_page`): one token is computed, not a page.
The tree's page then leaves the request's lock, copied or not (a resumed request does not need it; no block is left
beside it), so it never holds a page of the pool the request cannot grow into.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from radixcache import RadixCache
from radixcache.policy.admission import AdmissionPolicy, make_admission
from radixcache.runtime.kv.adoptions import Adoptions
from radixcache.runtime.kv.leases import LeaseTable
from radixcache.runtime.kv.pins import PinTable
from radixcache.runtime.kv.release import Releasing
from radixcache.runtime.kv.retention import RetentionPolicy

if TYPE_CHECKING:
    from radixcache.runtime.kv.events import KVEventLog
    from radixcache.runtime.kv.tier.coordinator import KVTiers


class KVManager(Releasing):
    """Admission, growth, in-flight commits, pins and release of requests' pages in one RadixCache.

    With `enable_cache=False` it allocates and frees blocks the same way but never matches, commits or inserts,
    so nothing is reused (the baseline). `max_pinned_blocks`: the most pages pins may lock (kv.pins).
    `admission`: how much of each request the tree adopts (a name in radixcache.policy.admission.ADMISSION_POLICIES, a
    policy, or None for "all"); `declined_pages` counts the computed full pages it declined (freed instead).
    `copy_page(src, dst)`: copies one block's K/V (every layer) into another; without it, a match that reaches the
    last token gives up that token's page and it is computed again (see "The last token" above).

    Assembled from layers on one object, each in its own module: kv.matching (match, lock, allocate, grow: the
    base), kv.commit (in-flight commits, the admission limit, pins), kv.release (release, preempt, abort).
    """

    def __init__(
        self,
        cache: RadixCache,
        *,
        enable_cache: bool = True,
        retention: RetentionPolicy | None = None,
        max_pinned_blocks: int = 0,
        tiers: KVTiers | None = None,
        events: KVEventLog | None = None,
        admission: str | AdmissionPolicy | None = None,
        max_lease_blocks: int = 0,
        lease_clock: Callable[[], float] | None = None,
        copy_page: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cache = cache
        self.copy_page = copy_page  # (source block, destination block): one page's K/V, every layer (KVPool)
        self.tiers = tiers if enable_cache else None
        self.events = events if enable_cache else None  # stored/removed page keys for a router (kv.events)
        self.enable_cache = enable_cache
        self.page_size = cache.page_size
        self.retention = retention
        self.pins = PinTable(cache, max_pinned_blocks)
        self.leases = LeaseTable(cache, max_lease_blocks, lease_clock)  # kv.leases: finished requests' pages, timed
        self.admission = make_admission(admission, eviction=cache.policy)
        self.declined_pages = 0  # computed full pages the admission policy kept out of the tree (freed)
        self._policy_failed = False  # warned once already
        self._adoptions = Adoptions(self.tiers, self.events)  # where adopted pages go next; their deferred faults
