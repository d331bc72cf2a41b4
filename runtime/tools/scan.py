"""Small incremental JSON scanning helpers for the tool-call parser: each looks at text that may still grow and
answers "ok" (with the end), "more" (the text so far could still match) or "no".

A text that keeps answering "more" is scanned again as it grows; whitespace is what can grow without end there (a
model looping on newlines), so `memo` (start: end, valid while the text before its end is unchanged) lets each
whitespace run be read once, not once per delta.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

WHITESPACE = " \t\n\r"


Memo = dict[int, int]


def skip_ws(text: str, pos: int, memo: Memo | None = None) -> int:
    p = pos if memo is None else memo.get(pos, pos)
    while p < len(text) and text[p] in WHITESPACE:
        p += 1
    if memo is not None:
        memo[pos] = p
    return p


def literals(text: str, pos: int, lits: Sequence[str], memo: Memo | None = None) -> tuple[str, int]:
    """Match `lits` in order, whitespace allowed before each: ("ok", end), ("more", pos) or ("no", pos)."""
    p = pos
    for lit in lits:
        p = skip_ws(text, p, memo)
        rest = text[p : p + len(lit)]
        if rest == lit:
            p += len(lit)
        elif lit.startswith(rest):
            return "more", pos
        else:
            return "no", pos
    return "ok", p


def string(text: str, pos: int, limit: int | None = None, memo: Memo | None = None) -> tuple[str, int, str]:
    """A JSON string after optional whitespace: ("ok", end, value), ("more", pos, "") or ("no", pos, ""); "no" too
    for one written in more than `limit` characters (its quotes included), closed or not."""
    p = skip_ws(text, pos, memo)
    if p >= len(text):
        return "more", pos, ""
    if text[p] != '"':
        return "no", pos, ""
    i, escaped = p + 1, False
    end = len(text) if limit is None else min(len(text), p + limit)
    while i < end:
        ch = text[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            try:
                value = json.loads(text[p : i + 1])
            except ValueError:
                return "no", pos, ""
            return "ok", i + 1, value
        elif ch in "\n\r":
            return "no", pos, ""
        i += 1
    return "more" if end == len(text) else "no", pos, ""


class ValueScanner:
    """Follows one JSON object or array as it arrives: `feed(text, pos)` returns how far it got and whether the
    value closed there (strings and escapes respected)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str, pos: int) -> tuple[int, bool]:
        for i in range(pos, len(text)):
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1, True
        return len(text), False
