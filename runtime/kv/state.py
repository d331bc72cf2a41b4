"""A request's KV state: what one sequence holds of the pool and the tree, owned by the KV manager.

The engine creates one `KVState` per request (with the few facts the manager needs that never change: namespace,
prompt length, most new tokens, pin, admission hint, arrival) and hands it to the manager's methods together with
plain values (the token ids so far). Only the manager (kv.manager) and the model runner (which advances `num_kv`
once a pass has returned) write it; the request merely holds it (`req.kv`). Neither `kv/` nor `engine/` needs the
other's types for this: the state lives here, below both.

Invariants (kv.manager keeps them, also when a method raises):
- WAITING, FINISHED, ABORTED: `block_table` is empty, `match_node` is None: the request holds nothing.
- RUNNING: `match_node` is locked in the tree (or None with no match); `block_table[j]` holds positions
  `[j * P, (j + 1) * P)`; its first `tree_blocks` entries belong to the tree (the locked path), the rest
  (`held_blocks`) are the request's own until release. Pages past `admit_limit` never go to the tree.
- `num_kv` counts the leading positions whose K/V are in those pages.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from radixcache import TreeNode
from radixcache.page_hash import PageChain
from radixcache.policy.admission import AdmissionRequest
from radixcache.runtime.kv.leases import LeaseGrant
from radixcache.runtime.kv.tier.layered_load import LayeredLoad


class Status(Enum):
    """Where a request's KV is: the state names what it holds."""

    WAITING = "waiting"  # not yet admitted (or preempted): holds no blocks
    RUNNING = "running"  # admitted: holds a lock and blocks
    FINISHED = "finished"  # released: its KV went to the tree (or was freed)
    ABORTED = "aborted"  # released after an error


@dataclass(eq=False, slots=True)
class KVState:
    """One request's pages, lock and KV accounting (see the module's invariants).

    Fixed at creation: `rid` (named in errors), `namespace`, `prompt_tokens`, `max_new_tokens`, `pin` (prompt
    tokens to pin once computed), `retain` (the admission hint), `arrival_ms` (what the admission policy sees),
    `retain_for` (seconds of lease asked for; `lease`, what release granted).
    Accounting: `cached_tokens` (prompt tokens found cached at the first admission, at most `cached_cap`),
    `found_pages` (pages found then: what admission may never decline), `recomputed_tokens` (positions computed
    again after preemptions), `computed_max` (the most positions ever computed), `preemptions`.
    """

    rid: int = 0
    namespace: Hashable = None
    prompt_tokens: int = 0
    max_new_tokens: int = 0
    pin: int = 0
    pin_holder: str | None = None  # who holds the pin (kv.pins); None: the caller at large
    retain: str | None = None
    arrival_ms: float = 0.0
    retain_for: float | None = None  # seconds to lease the pages once finished (kv.leases); None: not asked
    # what it holds
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    tree_blocks: int = 0
    match_node: TreeNode | None = None
    num_kv: int = 0
    tier_pages: int = 0  # pages the last admission copied in from the host or disk tier (counted in num_kv)
    page_chain: PageChain | None = field(default=None, repr=False)  # page hashes for the tiers and events
    # accounting
    cached_tokens: int = 0
    cached_cap: int | None = None  # report at most this many cached tokens (fork: what was cached before the call)
    found_pages: int = 0
    admit_limit: int | None = None  # pages (from the root) the tree may adopt; decided once (kv.manager)
    computed_max: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    lease: LeaseGrant | None = None  # what release granted (kv.leases)
    # disk pages counted in num_kv but copied into their blocks layer by layer (kv.tier.layered_load); never in
    # the tree before every layer is in
    pending_load: LayeredLoad | None = field(default=None, repr=False)

    def admission_request(self, page_size: int, output_tokens: int | None) -> AdmissionRequest:
        """What the admission policy sees of this request (radixcache.policy.admission): its total is what it
        computed once it finished with `output_tokens`, else the most it may compute."""
        computed = self.num_kv // page_size
        most = (self.prompt_tokens + self.max_new_tokens - 1) // page_size  # the last token's K/V never exists
        return AdmissionRequest(
            namespace=self.namespace,
            cached_pages=self.found_pages,
            prompt_pages=self.prompt_tokens // page_size,
            total_pages=computed if output_tokens is not None else max(computed, most),
            retain=self.retain,
            timestamp=self.arrival_ms,
            output_tokens=output_tokens,  # known only once it finished
        )

    def drop_failed_load(self, page_size: int) -> int:
        """Drop the deferred disk load whose copy raised (a failed read): its pages are recomputed, so the positions
        end before them and the counts leave them out. Returns the positions lost."""
        load = self.pending_load
        assert load is not None
        self.pending_load = None
        load.drop()
        start = self.block_table.index(load.blocks[0]) * page_size
        lost = max(0, self.num_kv - start)  # num_kv has not moved since admission: the chunk never finished
        self.num_kv -= lost
        self.tier_pages -= load.pages
        if self.preemptions == 0:
            self.cached_tokens = min(self.cached_tokens, self.num_kv)
            self.found_pages -= load.pages
        return lost

    @property
    def held_blocks(self) -> list[int]:
        """Blocks this request holds (allocated, not yet inserted or freed)."""
        return self.block_table[self.tree_blocks :]
