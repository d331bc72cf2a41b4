"""The rules a GBNF grammar's rules name, read from its text before the library converts it to Lark.

Why: llguidance's GBNF-to-Lark conversion takes time growing with the square of a chain's length (rules each naming
the next: 1,000 took 0.35 s, 2,000 1.5 s, 3,000 3.4 s on this project's 2-core VM, idle; a 128 KiB grammar, the
server's bound, holds about 8,000), and `lark_check` refused every chain over MAX_RULE_DEPTH only after converting
it. A request could so hold a worker thread's core for tens of seconds before its 400. `gbnf_uses` gives the same
definitions-and-mentions map that `lark_check` builds from Lark, so the depth is checked first and the library
converts only grammars whose chains it compiles.

The scan: a definition starts a line (`name ::=`, names of letters, digits, `_` and `-`) and runs to the next one;
string literals (`"..."`), character classes (`[...]`), repetition counts (`{m,n}`) and `#` comments are skipped.
"""

from __future__ import annotations

import re

_HEAD = re.compile(r"[ \t]*([A-Za-z0-9_-]+)[ \t]*::=")
_NAME = re.compile(r"[A-Za-z0-9_-]+")


def gbnf_uses(text: str) -> dict[str, list[str]]:
    """Each definition of a GBNF grammar: the names its body mentions, in order (numbers in `{m,n}` are not
    names). A name defined twice gathers both bodies' mentions."""
    uses: dict[str, list[str]] = {}
    current: list[str] | None = None
    i, n, line_start = 0, len(text), True
    while i < n:
        if line_start and (head := _HEAD.match(text, i)) is not None:
            current = uses.setdefault(head.group(1), [])
            i, line_start = head.end(), False
            continue
        c = text[i]
        line_start = c == "\n"
        if c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c in '"[':
            i = after_quoted(text, i, '"' if c == '"' else "]")
        elif c == "{":
            end = text.find("}", i)
            i = n if end < 0 else end + 1
        elif (name := _NAME.match(text, i)) is not None:
            if current is not None:
                current.append(name.group())
            i = name.end()
        else:
            i += 1
    return uses


def after_quoted(text: str, i: int, close: str) -> int:
    """The index past the literal (or class) opening at `i` and closed by `close` (backslash escapes skipped); one cut
    by its line's end stops there (the library refuses it). Shared with lark_check's scan of Lark text."""
    j = i + 1
    while j < len(text) and text[j] != "\n":
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == close:
            return j + 1
        j += 1
    return j
