"""The exact text the model emitted for its tool calls, by call ids, so a history that replays the calls (as
OpenAI clients do: ids, names, arguments, no text) is rendered with the tokens the model generated: the text, and
where known the token ids it was emitted as (runtime.tools.known_tokens splices them into the next prompt).

Bounded by entries and by bytes (least recently used dropped first; the newest entry always stays) and
thread-safe. A lookup returns the text only when every call
matches one remembered by id, name and arguments (as JSON values), so a client cannot inject text by reusing ids,
and, when the reply's content was remembered, when the message says that content: the remembered text holds the
content the model wrote, so a message whose content was edited is not that reply (it renders as its own text).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from radixcache.runtime.tools.messages import ToolCall

# raw text, the calls, the emitted token ids (empty: not known), the content outside the calls (None: not known)
_Entry = tuple[str, tuple[ToolCall, ...], tuple[int, ...], str | None]


class ToolCallMemory:
    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 << 20) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes  # a reply may be a whole context of text and ids: entries alone bound nothing
        self._entries: OrderedDict[tuple[str, ...], _Entry] = OrderedDict()
        self._sizes: dict[tuple[str, ...], int] = {}
        self.bytes = 0  # the entries' estimated size (_size), what max_bytes bounds
        self._lock = threading.Lock()

    def remember(
        self, calls: Sequence[ToolCall], raw_text: str, token_ids: Sequence[int] = (), content: str | None = None
    ) -> None:
        """Remember that the model wrote `raw_text` (without the stop token) for `calls`, as `token_ids` when given
        (the ids that decode to exactly `raw_text`); `content`, when given, is the reply's text outside the calls
        ("" for none), which a replayed message must say for `raw_text` to stand for it."""
        if not calls:
            return
        key = tuple(c.id for c in calls)
        entry = (raw_text, tuple(calls), tuple(token_ids), content)
        with self._lock:
            self.bytes -= self._sizes.pop(key, 0)
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._sizes[key] = _size(entry)
            self.bytes += self._sizes[key]
            while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self.bytes > self.max_bytes):
                oldest, _ = self._entries.popitem(last=False)
                self.bytes -= self._sizes.pop(oldest)

    def lookup(self, calls: Sequence[ToolCall], content: str | None = None) -> str | None:
        """The remembered text for exactly these calls said with `content` (None or "": none), or None."""
        found = self.lookup_emitted(calls, content)
        return None if found is None else found[0]

    def lookup_emitted(
        self, calls: Sequence[ToolCall], content: str | None = None
    ) -> tuple[str, tuple[int, ...]] | None:
        """(text, token ids; empty when not known) remembered for exactly these calls said with `content`, or
        None."""
        key = tuple(c.id for c in calls)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
        raw, known, ids, said = entry
        if said is not None and (content or "") != said:
            return None
        try:
            same = len(known) == len(calls) and all(a.same_call(b) for a, b in zip(known, calls, strict=True))
        except ValueError:
            return None
        return (raw, ids) if same else None

    def __len__(self) -> int:
        return len(self._entries)


def _size(entry: _Entry) -> int:
    """An entry's size in bytes, estimated: its characters, and 8 bytes a token id (a tuple's slot; ids past 256
    are objects of their own, 28 bytes more, which the estimate leaves to the bound's slack)."""
    raw, calls, ids, content = entry
    said = sum(len(c.id) + len(c.name) + len(c.arguments) for c in calls)
    return len(raw) + said + 8 * len(ids) + len(content or "") + 200  # 200: the tuples and the key
