"""A schema's `pattern`s as the grammar library matches them right inside a JSON string.

The library matches a `pattern` against the string's JSON text, quoting the regex's character classes to their
escapes. A class that holds every control character (U+0000 to U+001F) admitted the escapes `\\"` and `\\\\`
whatever the class said (llguidance 1.9.1): `[^"]*` (no quote) let the model write `a\\"b`, a string holding a quote,
and `[^\\\\]` a backslash; a 200 whose answer fails its own schema. A class that leaves one control character out
is quoted exactly. So every negated class `[^...]` also leaves out U+0000 (`[^"]` becomes `[^\\x00"]`): it admits
no text it did not (a NUL is no text a model writes), and the escapes only where its characters allow them. A
pattern with class set operations (`--`, `~~`), where a negated class may add to a set rather than bound it, is kept
as it is; so is a positive class spanning the controls (`[\\x00-\\x1f]`), which this does not read.
"""

from __future__ import annotations

from typing import Any

from radixcache.runtime.grammar.schema_check import DATA_KEYWORDS, SCHEMA_MAPS

_NO_NUL = "\\x00"


def quote_safe_pattern(pattern: str) -> str:
    """`pattern` with U+0000 left out of each negated class (after a leading `]`, which is the class's own)."""
    if "--" in pattern or "~~" in pattern:
        return pattern
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":  # an escape: `\[` is no class, `\x{...}` holds no bracket
            out.append(pattern[i : i + 2])
            i += 2
        elif pattern.startswith("[^", i):
            end = i + 3 if pattern.startswith("]", i + 2) else i + 2
            out.append(pattern[i:end] + _NO_NUL)
            i = end
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


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
