"""The responses the server keeps for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`: in memory,
bounded, least recently used dropped first.

Each entry is one response: the response object as it was answered, the whole conversation it answered (the
canonical items of its chain and its own input: runtime.server.responses_input.items_of) and its output items, so a
follow-up rebuilds its history from one entry, whatever became of the entries before it. Entries are keyed by the
caller's tenant (its API key; None for keyless callers) and the id: one key never reads, lists nor deletes another
key's responses, and an id (128 random bits) is the only way to name one. Bounded per tenant by a count and by bytes
(each entry's size as JSON), and in bytes over all tenants, where the tenant holding the most bytes loses its least
recently used (runtime/tools/fair_lru.py; never the entry just kept), so a tenant holding no more than its share
keeps its responses however much the others store. An entry larger than a tenant's byte bound is not kept.
Not shared across server processes, nor kept across restarts: a follow-up to a forgotten response is answered
`previous_response_not_found`, as OpenAI answers one it does not have.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.tools.fair_lru import FairLRU

MAX_ENTRIES = 4096  # per tenant
MAX_BYTES = 64 << 20  # per tenant
MAX_TOTAL_BYTES = 256 << 20  # all tenants together


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]  # the response object as answered
    items: list[dict[str, Any]]  # the conversation it answered, canonical items (the chain's, then its input)
    output: list[dict[str, Any]]  # its output items
    size: int


class ResponseStore:
    """Each tenant has its own bounds (`max_entries`, `max_bytes`), and past `max_total_bytes` (all tenants) the
    tenant holding the most bytes loses its least recently used, so one key's traffic never pushes out another
    key's responses while that one holds no more than its share (`max_total_bytes` over the tenants storing)."""

    def __init__(
        self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES
    ) -> None:
        if min(max_entries, max_bytes, max_total_bytes) < 1:
            raise ValueError(
                f"the bounds must be at least 1, got {max_entries} entries, {max_bytes} and {max_total_bytes} bytes"
            )
        self.max_entries, self.max_bytes, self.max_total_bytes = max_entries, max_bytes, max_total_bytes
        # by (tenant, id), weighed in bytes; no bound on all tenants' count (each tenant's is max_entries)
        self._lru: FairLRU[str, Stored] = FairLRU(sys.maxsize, max_total_bytes)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return self._lru.weight

    def tenant_bytes(self, tenant: str | None) -> int:
        return self._lru.held(tenant)[1]

    def put(
        self, tenant: str | None, response: dict[str, Any], items: list[dict[str, Any]], output: list[dict[str, Any]]
    ) -> bool:
        """Keep a response (the most recently used); False when it alone is larger than a tenant's byte bound."""
        size = len(json.dumps([response, items, output], separators=(",", ":")))
        if size > min(self.max_bytes, self.max_total_bytes):
            return False
        rid = response["id"]
        self._lru.put(tenant, rid, Stored(response, items, output, size), size)  # evicts past max_total_bytes
        while (held := self._lru.held(tenant))[0] > self.max_entries or held[1] > self.max_bytes:
            self._lru.pop(tenant, self._lru.oldest(tenant))  # never the newest: it alone fits both bounds
        return True

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        """The entry (now the most recently used), or None: unknown, forgotten, or another tenant's."""
        return self._lru.get(tenant, response_id)

    def delete(self, tenant: str | None, response_id: str) -> bool:
        return self._lru.pop(tenant, response_id) is not None
