"""A schema's `pattern`s as the grammar library matches them right inside a JSON string.

The library matches a `pattern` against the string's JSON text, quoting the regex to its escapes. Where the regex
admits every control character (U+0000 to U+001F) at one point, the library admitted the escapes `\\"` and `\\\\`
there whatever the regex said (llguidance 1.9.1): `[^"]*` (no quote) let the model write `a\\"b`, a string holding a
quote, `[^\\\\]` a backslash, and the positive `[\\x00-\\x1f]*` (controls only) or `\\p{Cc}` a quote or a
backslash too; a 200 whose answer fails its own schema. A regex that leaves one control character out is quoted
exactly. So every part of a pattern that may match U+0000 is made to leave it out: a negated class `[^...]` also
excludes it (`[^"]` becomes `[^\\x00"]`), a positive class that may hold it (one with an escape or a nested class)
is taken less it (`[[\\x00-\\x1f]--\\x00]`), so is a Unicode class (`\\p{Cc}`, `\\P{..}`), and a NUL written alone
(`\\x00`) matches nothing; `.`, `\\D`, `\\W` and `\\S` are kept, as they hold the quote and the backslash anyway.
It admits no text it did not (a NUL is no text a model writes), and the escapes only where the pattern allows them.
A pattern this scanner cannot follow (a class left open) is kept as it is, for the library to refuse.
"""

from __future__ import annotations

import re
from typing import Any

from radixcache.runtime.grammar.schema_check import DATA_KEYWORDS, SCHEMA_MAPS

_NO_NUL = "\\x00"
_NOTHING = "[\\x00--\\x00]"  # an empty class: a NUL written alone
_BRACED = re.compile(r"\\[xuUpP]\{[^}]*\}")
_FIXED = {"x": 4, "u": 6, "U": 10, "p": 3, "P": 3}  # `\xHH`, `\uHHHH`, `\UHHHHHHHH`, `\pL`
_ASCII_CLASS = re.compile(r"\[:\^?[a-z]+:\]")
_FLAGS = re.compile(r"\(\?([a-zA-Z-]*)([:)])")
_SET_OPERATIONS = ("--", "&&", "~~")


def quote_safe_pattern(pattern: str) -> str:
    """`pattern` with every part that may match U+0000 made to leave it out (see the module's docstring)."""
    out: list[str] = []
    flags = [""]  # the flags in force, per open group (`x`: `#` starts a comment, whose brackets open no class)
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            escape = _escape_at(pattern, i)
            i += len(escape)
            out.append(_NOTHING if _is_nul(escape) else f"[{escape}--{_NO_NUL}]" if escape[1:2] in "pP" else escape)
        elif c == "[":
            end = _class_end(pattern, i)
            if end is None:
                return pattern
            out.append(_without_nul(pattern[i + 1 : end]))
            i = end + 1
        elif c == "\0":
            out.append(_NOTHING)
            i += 1
        elif c == "(":
            found = _FLAGS.match(pattern, i)
            group = found.group(0) if found else c
            if found and found.group(2) == ")":  # `(?s)`: to the end of the group it is in
                flags[-1] = _set_flags(flags[-1], found.group(1))
            else:
                flags.append(_set_flags(flags[-1], found.group(1)) if found else flags[-1])
            out.append(group)
            i += len(group)
        elif c == ")":
            if len(flags) > 1:
                flags.pop()
            out.append(c)
            i += 1
        elif c == "#" and "x" in flags[-1]:  # a comment of the verbose flag, to the line's end
            end = pattern.find("\n", i)
            end = len(pattern) if end < 0 else end
            out.append(pattern[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _escape_at(pattern: str, i: int) -> str:
    """The escape that starts at `pattern[i]` (a backslash), whole: `\\x{0}`, `\\x00`, `\\p{Cc}`, `\\pL`, `\\n`."""
    if found := _BRACED.match(pattern, i):
        return found.group(0)
    return pattern[i : i + _FIXED.get(pattern[i + 1 : i + 2], 2)]


def _is_nul(escape: str) -> bool:
    digits = escape[2:].strip("{}")
    return escape[1:2] in ("x", "u", "U") and bool(digits) and set(digits) <= set("0")


def _class_end(pattern: str, i: int) -> int | None:
    """The index of the `]` that closes the class opened at `pattern[i]`, nested classes and escapes followed;
    None when it is left open."""
    depth, j = 0, i
    while j < len(pattern):
        c = pattern[j]
        if c == "[" and (found := _ASCII_CLASS.match(pattern, j)) and depth:
            j = found.end()
        elif c == "[":
            depth += 1
            j += 1
            j += pattern.startswith("^", j)
            j += pattern.startswith("]", j)  # a `]` first in a class is the class's own
        elif c == "\\":
            j += len(_escape_at(pattern, j))
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j
            j += 1
        else:
            j += 1
    return None


def _without_nul(body: str) -> str:
    """The class `[body]` less U+0000 (a class that leaves it out already, as this makes them, kept as it is)."""
    if body.endswith("--" + _NO_NUL) or (body.startswith("^") and _NO_NUL in (body[1:5], body[2:6], body[-4:])):
        return f"[{body}]"
    if body.startswith("^"):
        inner = body[1:]
        if "[" in inner or any(op in inner for op in _SET_OPERATIONS):  # `^` negates the whole set expression
            return f"[^[{inner}]{_NO_NUL}]"
        first = 1 if inner.startswith("]") else 0  # `[^]a]`: `]\x00a`, the leading `]` kept first
        return f"[^{inner[:first]}{_NO_NUL}{inner[first:]}]"
    if not any(c in body for c in "\\[\0"):  # no escape, nested class or NUL: no range of it starts at U+0000
        return f"[{body}]"
    return f"[[{body}]--{_NO_NUL}]"


def _set_flags(current: str, change: str) -> str:
    on, _, off = change.partition("-")
    return "".join(sorted((set(current) | set(on)) - set(off)))


def quote_safe_patterns(schema: Any) -> Any:
    """`schema` with every `pattern` and `patternProperties` name made `quote_safe_pattern` (data, the values of
    `enum`, `const`, `default` and `examples`, and property names kept as they are)."""
    if isinstance(schema, list):
        return [quote_safe_patterns(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in DATA_KEYWORDS:
            out[k] = v
        elif k == "pattern" and isinstance(v, str):
            out[k] = quote_safe_pattern(v)
        elif k in SCHEMA_MAPS and isinstance(v, dict):
            names = {n: quote_safe_pattern(n) if k == "patternProperties" else n for n in v}
            if len(set(names.values())) < len(names):  # two names made one: kept as they were
                names = {n: n for n in v}
            out[k] = {names[n]: quote_safe_patterns(s) for n, s in v.items()}
        else:
            out[k] = quote_safe_patterns(v)
    return out
