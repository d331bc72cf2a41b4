"""What the disk store reports: a snapshot of its index and counters, and the result of checking every file.
Frozen, plain data (the CLI prints them as JSON through `as_dict`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DiskStoreStats:
    """A snapshot of a store. `pages` and `bytes` are the index's (file sizes, headers included);
    `fingerprints` maps each fingerprint string to its page count and `fingerprint_bytes` to its bytes
    (a fingerprint directory whose fingerprint.json is missing shows as "?<tag>")."""

    directory: str
    pages: int
    bytes: int
    max_bytes: int
    enabled: bool
    pending_writes: int
    writes: int
    dropped_writes: int
    read_hits: int
    read_misses: int
    corrupt_pages: int
    evicted_pages: int
    fingerprints: Mapping[str, int] = field(default_factory=dict)
    fingerprint_bytes: Mapping[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["fingerprints"] = dict(self.fingerprints)
        out["fingerprint_bytes"] = dict(self.fingerprint_bytes)
        return out


@dataclass(frozen=True)
class VerifyReport:
    """The result of `DiskStore.verify`: page files checked, how many were sound, the paths of the corrupt ones
    (and, in the same order, why each failed), and how many of those were deleted. ok + len(corrupt) == checked."""

    checked: int
    ok: int
    corrupt: tuple[str, ...]
    removed: int
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "ok": self.ok,
            "corrupt": list(self.corrupt),
            "removed": self.removed,
            "reasons": list(self.reasons),
        }
