"""The exact text the model emitted for its tool calls, by call ids, so a history that replays the calls (as
OpenAI clients do: ids, names, arguments, no text) is rendered with the tokens the model generated: the text, and
where known the token ids it was emitted as (runtime.tools.known_tokens splices them into the next prompt).

Kept per cache namespace: a handle `scoped(namespace)` remembers under the request's namespace and finds only its
own entries (and unscoped ones), so one tenant's history never renders with another tenant's remembered text, and
one tenant's tool traffic cannot evict another's calls while the other holds no more than its share. Bounded by
entries and by bytes on all namespaces together, shared by their tenants (runtime/tools/fair_lru.py fair_scope: the
server's salts of one key are one tenant); past a bound the tenant holding the most (entries, or bytes) loses its
least recently used entry, so a tenant under its fair share (the bound over the tenants in use) keeps its calls
however much another sends, under however many salts; the newest entry always stays, and one heavier than an
eighth of the bytes is not kept (as the compiled grammars and legacy call ids: kept, it would flush every tenant's
calls; its calls re-render, as forgotten ones do). Thread-safe. The unscoped
handle (a plain `ToolCallMemory()`, and the cluster front's) remembers entries every namespace finds, and finds any
entry by its ids (random secrets: the caller holds them because it made those calls).

A lookup returns the text only when every call matches one remembered by id, name and arguments (as JSON values),
so a client cannot inject text by reusing ids, and, when the reply's content was remembered, when the message says
that content: the remembered text holds the content the model wrote, so a message whose content was edited is not
that reply (it renders as its own text).
"""

from __future__ import annotations

import copy
import threading
from array import array
from collections.abc import Hashable, Sequence

from radixcache.runtime.tools.fair_lru import FairLRU, fair_scope
from radixcache.runtime.tools.messages import ToolCall

# raw text, the calls, the emitted token ids (empty: not known), the content outside the calls (None: not known); the
# ids as 8-byte machine integers: a tuple of them held an int object (28 bytes) past its 8-byte slot for each id
_Entry = tuple[str, tuple[ToolCall, ...], array, str | None]
_Ids = tuple[str, ...]


class _Unscoped:
    def __repr__(self) -> str:
        return "UNSCOPED"


UNSCOPED: Hashable = _Unscoped()  # the namespace of a handle that names none (see the module docstring)


class ToolCallMemory:
    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 << 20) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self._store = _Store(max_entries, max_bytes)
        self.namespace: Hashable = UNSCOPED

    def scoped(self, namespace: Hashable) -> ToolCallMemory:
        """A handle on this memory that remembers under `namespace` (a request's cache namespace) and finds only
        that namespace's entries and unscoped ones."""
        view = copy.copy(self)
        view.namespace = namespace
        return view

    @property
    def max_entries(self) -> int:
        return self._store.max_entries

    @property
    def max_bytes(self) -> int:
        return self._store.max_bytes  # a reply may be a whole context of text and ids: entries alone bound nothing

    @property
    def bytes(self) -> int:
        """The entries' estimated size (_size), all namespaces together: what max_bytes bounds."""
        return self._store.bytes

    def remember(
        self, calls: Sequence[ToolCall], raw_text: str, token_ids: Sequence[int] = (), content: str | None = None
    ) -> None:
        """Remember that the model wrote `raw_text` (without the stop token) for `calls`, as `token_ids` when given
        (the ids that decode to exactly `raw_text`); `content`, when given, is the reply's text outside the calls
        ("" for none), which a replayed message must say for `raw_text` to stand for it."""
        if calls:
            self._store.put(
                self.namespace, tuple(c.id for c in calls), (raw_text, tuple(calls), array("q", token_ids), content)
            )

    def lookup(self, calls: Sequence[ToolCall], content: str | None = None) -> str | None:
        """The remembered text for exactly these calls said with `content` (None or "": none), or None."""
        found = self.lookup_emitted(calls, content)
        return None if found is None else found[0]

    def lookup_emitted(
        self, calls: Sequence[ToolCall], content: str | None = None
    ) -> tuple[str, tuple[int, ...]] | None:
        """(text, token ids; empty when not known) remembered for exactly these calls said with `content`, or
        None."""
        entry = self._store.get(self.namespace, tuple(c.id for c in calls))
        if entry is None:
            return None
        raw, known, ids, said = entry
        if said is not None and (content or "") != said:
            return None
        try:
            same = len(known) == len(calls) and all(a.same_call(b) for a, b in zip(known, calls, strict=True))
        except ValueError:
            return None
        return (raw, tuple(ids)) if same else None

    def reply_ids(self, first_id: str) -> tuple[str, ...] | None:
        """The ids of the remembered reply whose first call has id `first_id` (in this handle's namespace), or
        None: what runtime/tools/split_replies.py joins a reply sent back one message per call by."""
        return self._store.reply_ids(self.namespace, first_id)

    def __len__(self) -> int:
        return len(self._store.owner)


class _Store:
    """The entries of every namespace (runtime/tools/fair_lru.py: the fullest tenant loses its oldest), one entry per
    call ids: `owner` says which namespace holds each (its tenant is the entry's scope)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.lru: FairLRU[_Ids, _Entry] = FairLRU(max_entries, max_bytes)
        self.owner: dict[_Ids, Hashable] = {}  # the namespace each entry is remembered under
        self.by_first: dict[str, _Ids] = {}  # an entry's key by its first id (the latest such entry's)
        self.lock = threading.Lock()

    @property
    def max_entries(self) -> int:
        return self.lru.max_entries

    @property
    def max_bytes(self) -> int:
        return self.lru.max_weight or 0

    @property
    def bytes(self) -> int:
        return self.lru.weight

    def get(self, namespace: Hashable, key: _Ids) -> _Entry | None:
        with self.lock:
            if key not in self.owner:
                return None
            owner = self.owner[key]
            if not (namespace is UNSCOPED or owner is UNSCOPED or owner == namespace):
                return None
            return self.lru.get(fair_scope(owner), key)

    def reply_ids(self, namespace: Hashable, first_id: str) -> _Ids | None:
        with self.lock:
            key = self.by_first.get(first_id)
            owner = self.owner.get(key) if key is not None else None
            if key is None or not (namespace is UNSCOPED or owner is UNSCOPED or owner == namespace):
                return None
            return key

    def put(self, namespace: Hashable, key: _Ids, entry: _Entry) -> None:
        with self.lock:
            if key in self.owner:
                self._forget(key)
                self.lru.pop(fair_scope(self.owner.pop(key)), key)
            # an entry past an eighth of the bytes is not kept (its calls re-render): kept, the newest entry always
            # stays, and one reply the size of a context would flush the calls of every other tenant
            if _size(entry) > self.max_bytes // 8:
                return
            self.owner[key] = namespace
            self.by_first[key[0]] = key
            for _, gone in self.lru.put(fair_scope(namespace), key, entry, _size(entry)):
                self._forget(gone)
                del self.owner[gone]

    def _forget(self, key: _Ids) -> None:
        if self.by_first.get(key[0]) == key:
            del self.by_first[key[0]]


def _size(entry: _Entry) -> int:
    """An entry's size in bytes, estimated: its characters (one byte each for ASCII text), and 8 bytes a token id."""
    raw, calls, ids, content = entry
    said = sum(len(c.id) + len(c.name) + len(c.arguments) for c in calls)
    return len(raw) + said + 8 * len(ids) + len(content or "") + 200  # 200: the tuples and the key
