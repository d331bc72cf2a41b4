"""Ranges bounded on one side at a magnitude of 10**18 or more, which the grammar library cannot build.

The library builds an integer's or a number's range regex only for bounds below 10**18 on a side whose other side
is open, and refuses the rest naming no field and no way out ("Failed to generate regex for integer range:
min=Some(...), max=None", or "float range", at the schema's root, or a forced tool's whole `tools`). Whether a range
is open on its other side is the library's to say: it merges a schema's bounds with those of its `allOf` members, of
the schema a `$ref` beside them points to, and of the schema around an `anyOf` (`{"allOf": [{"minimum": 10**18},
{"type": "integer"}]}` is one-sided, `{"type": "integer", "minimum": 10**18, "allOf": [{"maximum": 2**62}]}` is
not). So a schema that holds such a bound is asked of the library itself, and the keyword it refuses is found by its
side and value.
"""

from __future__ import annotations

import math
import re
from typing import Any

import llguidance

from radixcache.runtime.grammar.schema_walk import schema_objects

ONE_SIDED_LIMIT = 10**18  # the library builds a one-sided range's regex only for bounds below this magnitude
NEAR_LIMIT = 0.999 * ONE_SIDED_LIMIT  # an exclusive bound just under it may have its first number inside at it
LOWER, UPPER = ("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")
_REFUSAL = re.compile(r"Failed to generate regex for (integer|float) range: min=(\S+), max=(\S+)")
_SOME = re.compile(r"Some\(([^)]*)\)")


def one_sided_message(kind: str, side: str) -> str:
    """Why a one-sided bound of `kind` ("an integer", "a number") past the library's limit is refused, and the fix."""
    other = "maximum" if side == "lower" else "minimum"
    return (
        f"the grammar cannot bound {kind} from {'below' if side == 'lower' else 'above'} at a magnitude of 10**18 or "
        f"more without a {other} too (the grammar library builds a one-sided range only below 10**18): add a {other} "
        "(its magnitude below 2**63)"
    )


def one_sided_refusal(schema: Any, path: str) -> tuple[str, str] | None:
    """(message, path of the keyword) when the library refuses `schema` for a one-sided range past its limit; None
    when `schema` holds no bound near the limit, or the library takes it (the other side bounded elsewhere), or
    refuses it for another reason (named by the compile)."""
    bounds = _near_limit(schema, path)
    if not bounds:
        return None
    try:
        message = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_json_schema(schema))
    except Exception:  # the translation's own refusals: the compile names them
        return None
    found = _REFUSAL.search(message or "")
    if found is None:
        return None
    side = "lower" if found.group(3) == "None" else "upper"
    edge = _SOME.search(found.group(2) if side == "lower" else found.group(3))
    value = float(edge.group(1)) if edge is not None else math.nan
    held = [(v, at) for s, v, at in bounds if s == side]
    if not held:
        return None
    at = min(held, key=lambda b: abs(b[0] - value) if math.isfinite(value) else 0.0)[1]  # the first, on a tie
    return one_sided_message("an integer" if found.group(1) == "integer" else "a number", side), at


def _near_limit(schema: Any, path: str) -> list[tuple[str, float, str]]:
    """(side, value, path) of every bound in `schema` whose magnitude is near the library's limit or past it, on the
    side it cannot leave open (a lower bound above +NEAR_LIMIT, an upper one below -NEAR_LIMIT), in schema order."""
    found: list[tuple[str, float, str]] = []
    for item, at in schema_objects(schema, path):
        for key, value in item.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if (key in LOWER and float(value) >= NEAR_LIMIT) or (key in UPPER and float(value) <= -NEAR_LIMIT):
                found.append(("lower" if key in LOWER else "upper", float(value), f"{at}.{key}"))
    return found
