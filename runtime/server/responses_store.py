"""The responses the server keeps for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`: in memory,
bounded, least recently used dropped first.

Each entry is one response: the response object as it was answered, the whole conversation it answered (the
canonical items of its chain and its own input: runtime.server.responses_input.items_of) and its output items, so a
follow-up rebuilds its history from one entry, whatever became of the entries before it. Entries are keyed by the
caller's tenant (its API key; None for keyless callers) and the id: one key never reads, lists nor deletes another
key's responses, and an id (128 random bits) is the only way to name one. Bounded per tenant by a count and by bytes
(each entry's size as JSON), and in bytes over all tenants: an entry larger than a tenant's byte bound is not kept.
Not shared across server processes, nor kept across restarts: a follow-up to a forgotten response is answered
`previous_response_not_found`, as OpenAI answers one it does not have.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

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
    """Each tenant has its own bounds (`max_entries`, `max_bytes`), so one key's traffic never pushes out another
    key's responses; past `max_total_bytes` (all tenants) the least recently used of all go first."""

    def __init__(
        self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES
    ) -> None:
        if min(max_entries, max_bytes, max_total_bytes) < 1:
            raise ValueError(
                f"the bounds must be at least 1, got {max_entries} entries, {max_bytes} and {max_total_bytes} bytes"
            )
        self.max_entries, self.max_bytes, self.max_total_bytes = max_entries, max_bytes, max_total_bytes
        self._entries: OrderedDict[tuple[str | None, str], Stored] = OrderedDict()  # all, least recent first
        self._tenants: dict[str | None, OrderedDict[str, None]] = {}  # a tenant's ids, least recent first
        self._tenant_bytes: dict[str | None, int] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_bytes(self, tenant: str | None) -> int:
        return self._tenant_bytes.get(tenant, 0)

    def put(
        self, tenant: str | None, response: dict[str, Any], items: list[dict[str, Any]], output: list[dict[str, Any]]
    ) -> bool:
        """Keep a response (the most recently used); False when it alone is larger than a tenant's byte bound."""
        size = len(json.dumps([response, items, output], separators=(",", ":")))
        if size > min(self.max_bytes, self.max_total_bytes):
            return False
        rid = response["id"]
        self.delete(tenant, rid)
        self._entries[(tenant, rid)] = Stored(response, items, output, size)
        own = self._tenants.setdefault(tenant, OrderedDict())
        own[rid] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self.bytes += size
        while len(own) > self.max_entries or self._tenant_bytes[tenant] > self.max_bytes:
            self.delete(tenant, next(iter(own)))
        while self.bytes > self.max_total_bytes:
            self.delete(*next(iter(self._entries)))
        return True

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        """The entry (now the most recently used), or None: unknown, forgotten, or another tenant's."""
        key = (tenant, response_id)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self._tenants[tenant].move_to_end(response_id)
        return entry

    def delete(self, tenant: str | None, response_id: str) -> bool:
        entry = self._entries.pop((tenant, response_id), None)
        if entry is None:
            return False
        own = self._tenants[tenant]
        del own[response_id]
        self._tenant_bytes[tenant] -= entry.size
        if not own:
            del self._tenants[tenant], self._tenant_bytes[tenant]
        self.bytes -= entry.size
        return True
