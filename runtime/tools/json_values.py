"""Checks on JSON values as Python's json reads them, shared by tools' parameters and grammar specs, and whether
a text is a JSON object (shared by the call parsers, the tool-turn checks and sessions).

Here, in tools, because grammar imports tools (through loading) and never the other way (tests/test_layout.py).
"""

from __future__ import annotations

import math
from typing import Any

from radixcache.runtime.tools.messages import JSON_CHECK


def non_finite_path(value: Any, path: str) -> str | None:
    """The path of the first NaN or Infinity in `value` (Python's json reads them; JSON has no such numbers), or
    None. Dicts and lists are walked without recursion. Shared by grammar specs and tools' parameters."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}") for k, v in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def json_object(text: str) -> bool:
    """`text` is a JSON object as RFC 8259 has it (not NaN nor Infinity, which Python's json.loads reads; integers of
    any length, which int() refuses past 4,300 digits); one nested deeper than Python's decoder reaches is not."""
    try:
        return isinstance(JSON_CHECK.decode(text), dict)
    except (ValueError, RecursionError):
        return False
