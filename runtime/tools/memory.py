"""The exact text the model emitted for its tool calls, by call ids, so a history that replays the calls (as
OpenAI clients do: ids, names, arguments, no text) is rendered with the tokens the model generated: the text, and
where known the token ids it was emitted as (runtime.tools.known_tokens splices them into the next prompt).

Bounded (least recently used dropped first) and thread-safe. A lookup returns the text only when every call
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
    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, ...], _Entry] = OrderedDict()
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
        with self._lock:
            self._entries[key] = (raw_text, tuple(calls), tuple(token_ids), content)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

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
