"""In-flight commits and pins: the layer of `KVManager` (kv.manager) that gives the tree a running request's pages.

`commit` inserts the full pages a pass computed while the request still runs, moving the request's lock down to the
node that ends them; `admission_limit` is the admission policy's answer (radixcache.policy.admission), asked once per
request and kept; `pin` locks exactly the whole pages a pinned prompt fills (kv.pins).

Invariants: no page reaches the tree before its every layer is in (a deferred disk load finishes first); pages past
the admission limit stay the request's own; the request's block table follows the tree (a page another request
inserted first replaces our duplicate, which the tree freed); a failing admission policy adopts every page, warned
once, and never fails a request.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from radixcache.node import path_blocks
from radixcache.policy.admission import AdmissionPolicy
from radixcache.runtime.kv.adoptions import Adoptions
from radixcache.runtime.kv.matching import Matching
from radixcache.runtime.kv.pins import PinTable
from radixcache.runtime.kv.state import KVState, Status
from radixcache.tokens import as_token_array


class Committing(Matching):
    """`commit`, `admission_limit` and `pin`: a running request's pages into the tree."""

    admission: AdmissionPolicy  # (set in KVManager.__init__)
    pins: PinTable
    _policy_failed: bool  # warned once already
    _adoptions: Adoptions

    def commit(self, kv: KVState, tokens: Sequence[int]) -> None:
        """Give the tree the request's computed full pages now (in flight), so that other requests hit them while
        this one still runs. `tokens`: the request's ids so far (prompt and output). The request's lock moves down
        to the node that ends its pages, and its block table takes the tree's blocks (a page another request
        inserted first replaces our duplicate, which the tree freed)."""
        if not self.enable_cache or kv.status is not Status.RUNNING:
            return
        self.load_layers(kv)  # no page reaches the tree before its every layer is in
        p = self.page_size
        full = kv.num_kv // p
        if full <= kv.tree_blocks:
            return
        full = min(full, self.admission_limit(kv))  # pages past the limit stay ours
        if full <= kv.tree_blocks:
            return
        cache, ns = self.cache, kv.namespace
        tokens = as_token_array(tokens[: full * p])  # converted once: the insert and the lock read it as it is
        cached = cache.insert(tokens, kv.block_table[:full], namespace=ns) // p
        self._adoptions.adopted(kv, tokens, cached, full)
        node = cache.lock_prefix(tokens, full * p, namespace=ns)
        assert node is not None, "the pages just inserted are in the tree, and locked"
        old, kv.match_node = kv.match_node, node
        if old is not None:
            cache.unlock(old)
        kv.block_table[kv.tree_blocks : full] = path_blocks(node, kv.tree_blocks * p, p)
        kv.tree_blocks = full
        self._adoptions.raise_fault()

    def admission_limit(self, kv: KVState, *, output_tokens: int | None = None) -> int:
        """Pages of a running request, counted from the root, that the tree may adopt. The admission policy is
        asked once per request and its answer kept (preemptions included); `output_tokens` given: the request has
        finished with that many, so its total is what it computed, not its most possible. A pin's pages are always
        adopted (a pin needs them in the tree)."""
        if kv.admit_limit is None:
            ask = kv.admission_request(self.page_size, output_tokens)
            try:
                pages = int(self.admission.admit(ask))
            except Exception as exc:  # a prediction must never fail a request or leak its pages: adopt them all
                if not self._policy_failed:
                    message = f"admission policy {self.admission.name!r} failed ({exc!r}); adopting every page"
                    warnings.warn(message, RuntimeWarning, stacklevel=2)
                    self._policy_failed = True
                pages = ask.total_pages
            kv.admit_limit = max(pages, kv.found_pages, kv.pin // self.page_size)
        return kv.admit_limit

    def pin(self, kv: KVState, tokens: Sequence[int], made_for: Sequence[int] | None = None) -> int:
        """Pin the first `kv.pin` tokens of `tokens` once the request's prompt is computed and committed: exactly
        the whole pages they fill, for the prompt `made_for` that `unpin` names (None: the request's prompt).
        Returns the tokens pinned (0: nothing asked, or refused past the pinned share)."""
        if not self.enable_cache or not kv.pin or kv.status is not Status.RUNNING:
            return 0
        n = min(kv.pin, kv.tree_blocks * self.page_size) // self.page_size * self.page_size
        made_for = tokens[: kv.prompt_tokens] if made_for is None else made_for
        return self.pins.pin(list(tokens[:n]), kv.namespace, made_for, kv.pin_holder) if n else 0
