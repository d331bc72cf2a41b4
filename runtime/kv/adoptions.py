"""Where the pages the tree adopts from a request go next: down the tiers (host memory, disk) and, as page keys,
into the KV event log a router reads. Either may raise (a failed copy, a failed publish) while the tree already holds
the pages and the KV manager's operation is half done: the error waits here until the manager, consistent again,
calls `raise_fault` (that request fails; the others go on)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from radixcache.runtime.kv.state import KVState

log = logging.getLogger("radixcache.tier")


class Adoptions:
    def __init__(self, tiers: Any, events: Any) -> None:
        self.tiers = tiers  # runtime.kv.tier.KVTiers, or None
        self.events = events  # runtime.kv.events.KVEventLog, or None
        self._fault: BaseException | None = None  # the first copy or publish that failed mid-operation

    def adopted(self, kv: KVState, tokens: Sequence[int], first: int, last: int) -> None:
        """The tree just adopted the request's pages `first .. last` (its own blocks): copied down the tiers, and
        their keys published. An error is kept for `raise_fault`, never raised here."""
        chain = kv.page_chain
        if last <= first or chain is None:
            return
        try:
            if self.tiers is not None:
                self.tiers.adopted(chain, tokens, first, last, kv.block_table[first:last])
        except BaseException as exc:
            self._fault = self._fault or exc
        try:
            if self.events is not None:
                self.events.stored(chain.upto(tokens, last)[first:last])
        except BaseException as exc:
            self._fault = self._fault or exc

    def finished(self, kv: KVState, tokens: Sequence[int] | None, pages: int) -> None:
        """A request finished, the tree holding its first `pages` pages: its run, used until now, is refreshed in the
        tiers once (O(run) a request, as its admission's refresh). Each page it added was placed by its run's last
        use before, its admission (kv.tier.coordinator `adopted`), so a long generation's pages were older than every
        run used since it began, and a tier busy with newer pages evicted them as they were written. Hashed off the
        loop where the chain lacks them (PageChain.deferred), a cancel's too (KVManager.abort). `tokens` None (a caller
        without them): only the pages the chain has hashed, its head; a prompt the device held whole is not hashed
        at admission, nor a page another request committed first. An error is logged, never raised nor kept: a
        refresh fails no request (a cancel's would have failed the next request's commit)."""
        chain = kv.page_chain
        if self.tiers is None or chain is None or pages <= 0:
            return
        try:
            run = chain.hashes[:pages] if tokens is None else chain.deferred(tokens, pages)
            if run:
                self.tiers.refresh(run)
        except Exception:
            log.exception("refreshing a finished request's pages in the KV tiers failed")

    def raise_fault(self) -> None:
        """Raise the error a tier copy or an event publish deferred (and forget it), if any."""
        fault, self._fault = self._fault, None
        if fault is not None:
            raise fault
