"""Typed field access for trace records, so every reader reports bad fields the same way."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from radixcache.trace.errors import TraceError

_MISSING = object()

#: The largest timestamp (ms) a trace may give: the replays' clocks count µs in floats, and past this a timestamp
#: times 1000 is infinite (about 1.8e305 ms; the trace readers refuse more at its file:line).
MAX_TIMESTAMP_MS = sys.float_info.max / 1000
while math.nextafter(MAX_TIMESTAMP_MS, math.inf) * 1000 < math.inf:
    MAX_TIMESTAMP_MS = math.nextafter(MAX_TIMESTAMP_MS, math.inf)


class FieldReader:
    """Reads fields of one decoded record and raises TraceError naming `path`, `where` and the field."""

    __slots__ = ("path", "record", "where")

    def __init__(self, path: str, where: str, record: Any) -> None:
        self.path = path
        self.where = where
        if not isinstance(record, dict):
            self.fail(f"expected a JSON object, got {type(record).__name__}")
        self.record = record

    def fail(self, message: str, field: str | None = None) -> NoReturn:
        raise TraceError(self.path, self.where, message, field)

    def get(self, field: str, default: Any = _MISSING) -> Any:
        value = self.record.get(field, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                self.fail("missing", field)
            return default
        return value

    def number(self, field: str, default: Any = _MISSING) -> int | float:
        value = self.get(field, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            self.fail(f"expected a number, got {value!r}", field)
        if value in (math.inf, -math.inf):  # msgpack holds infinities (JSON cannot): no clock or sum survives one
            self.fail(f"expected a finite number, got {value!r}", field)
        if value < 0:
            self.fail(f"must be >= 0, got {value!r}", field)
        return value

    def timestamp(self, field: str, default: Any = _MISSING) -> int | float:
        """A number of milliseconds, at most MAX_TIMESTAMP_MS."""
        value = self.number(field, default)
        if value is not default and value > MAX_TIMESTAMP_MS:
            self.fail(f"{value!r} ms is too large (at most {MAX_TIMESTAMP_MS:.4g}: the replays count µs)", field)
        return value

    def count(self, field: str, default: Any = _MISSING) -> int:
        value = self.get(field, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(f"expected a non-negative integer, got {value!r}", field)
        if value >= 2**63:  # no length, clock or size reaches it; past it, numpy and the simulator overflow
            self.fail(f"{value} is too large (at most 2**63 - 1)", field)
        return value

    def text(self, field: str, default: Any = _MISSING) -> str:
        value = self.get(field, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            self.fail(f"expected a string, got {type(value).__name__}", field)
        return value

    def int_list(self, field: str, default: Any = _MISSING) -> tuple[int, ...]:
        value = self.get(field, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, (list, tuple)):
            self.fail(f"expected a list of integers, got {type(value).__name__}", field)
        if not value or (set(map(type, value)) == {int} and min(value) >= 0 and max(value) < 2**63):
            return tuple(value)  # the common case, checked at C speed; the loop below words the error
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < 2**63:
                self.fail(f"item {index} is {item!r}, expected an integer in [0, 2**63)", field)
        return tuple(value)

    def items(self, field: str, check: Callable[[Any], bool], expected: str) -> list[Any]:
        value = self.get(field)
        if not isinstance(value, list):
            self.fail(f"expected a list, got {type(value).__name__}", field)
        for index, item in enumerate(value):
            if not check(item):
                self.fail(f"item {index} is not {expected}", field)
        return value
