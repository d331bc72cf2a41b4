"""What the disk store reports: a snapshot of its index and counters, and the check of every file (`verify_pages`).
The reports are frozen, plain data (the CLI prints them as JSON through `as_dict`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixcache.runtime.kv.tier.disk_layout import CacheDir

log = logging.getLogger("radixcache.disk")


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


def verify_pages(layout: CacheDir, corrupt_found: Callable[[str, str], bool]) -> VerifyReport:
    """Check every page file of `layout` (a newer format's are neither checked nor deleted); each corrupt one is logged
    and passed to `corrupt_found(hash_hex, path)`, which returns whether it was removed."""
    checked = ok = removed = 0
    corrupt: list[str] = []
    reasons: list[str] = []
    for hash_hex, path, error in layout.checked_page_files():
        checked += 1
        if not error:
            ok += 1
            continue
        corrupt.append(path)
        reasons.append(error)
        log.warning("disk KV cache: corrupt page %s: %s", path, error)
        removed += corrupt_found(hash_hex, path)
    return VerifyReport(checked=checked, ok=ok, corrupt=tuple(corrupt), removed=removed, reasons=tuple(reasons))


def remove_file(path: str) -> bool:
    """Delete a file (one already gone counts as deleted); False, with a warning, when it cannot be."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("disk KV cache: cannot delete %s: %s", path, exc)
        return False
    return True
