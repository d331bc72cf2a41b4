"""The responses the server keeps for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`: in memory,
bounded, least recently used dropped first.

Each entry is one response: the response object as it was answered, the whole conversation it answered (the
canonical items of its chain and its own input: runtime.server.responses_input.items_of) and its output items, so a
follow-up rebuilds its history from one entry, whatever became of the entries before it. Entries are keyed by the
caller's tenant (its API key; None for keyless callers) and the id: one key never reads, lists nor deletes another
key's responses, and an id (128 random bits) is the only way to name one. Bounded by a count and by bytes (each
entry's size as JSON): an entry larger than the byte bound alone is not kept. Not shared across server processes,
nor kept across restarts: a follow-up to a forgotten response is answered `previous_response_not_found`, as OpenAI
answers one it does not have.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 4096
MAX_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]  # the response object as answered
    items: list[dict[str, Any]]  # the conversation it answered, canonical items (the chain's, then its input)
    output: list[dict[str, Any]]  # its output items
    size: int


class ResponseStore:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(f"max_entries and max_bytes must be at least 1, got {max_entries} and {max_bytes}")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[tuple[str | None, str], Stored] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self, tenant: str | None, response: dict[str, Any], items: list[dict[str, Any]], output: list[dict[str, Any]]
    ) -> bool:
        """Keep a response (the most recently used); False when it alone is larger than the byte bound."""
        size = len(json.dumps([response, items, output], separators=(",", ":")))
        if size > self.max_bytes:
            return False
        key = (tenant, response["id"])
        self.delete(tenant, response["id"])
        self._entries[key] = Stored(response, items, output, size)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size
        return True

    def get(self, tenant: str | None, response_id: str) -> Stored | None:
        """The entry (now the most recently used), or None: unknown, forgotten, or another tenant's."""
        key = (tenant, response_id)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def delete(self, tenant: str | None, response_id: str) -> bool:
        entry = self._entries.pop((tenant, response_id), None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True
