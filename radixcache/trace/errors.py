"""The error every trace reader raises on bad input, naming the file, the line (or record) and the field."""

from __future__ import annotations

from radixcache.errors import RadixCacheError


class TraceError(RadixCacheError, ValueError):
    """A trace file that cannot be read: malformed JSON, a missing or mistyped field, a truncated stream.

    The message starts with `path:line:` (or `path: record N` for binary streams), then names the field.
    `path`, `where` and `field` are kept as attributes for programs that want them.
    """

    def __init__(self, path: str, where: str, message: str, field: str | None = None) -> None:
        self.path = path
        self.where = where
        self.field = field
        self.message = message
        prefix = place(path, where)
        detail = f"field {field!r}: {message}" if field else message
        super().__init__(f"{prefix}: {detail}")

    def __reduce__(self) -> tuple:
        # Rebuilt from its parts, so that it crosses a process boundary (radixcache.sim.read_ahead) whole.
        return (type(self), (self.path, self.where, self.message, self.field))


def place(path: str, where: str) -> str:
    """`path:line` for a line number, else `path: where` (a msgpack record, a field): how errors name a record."""
    return f"{path}:{where}" if where.isdigit() else f"{path}: {where}"
