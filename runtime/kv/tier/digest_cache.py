"""Whole-file content digests, cached by the file's identity, so that fingerprinting a multi-GB checkpoint by every
byte costs one read per new or changed file, not one per start.

A file's identity is (device, inode, size, mtime_ns, ctime_ns): an edit in place changes mtime and ctime, a
replacement changes the inode, and resetting the mtime (`touch -d`, `os.utime`) still changes the ctime. A file
modified less than two seconds before it is hashed is not cached (its mtime's granularity could hide a second
edit: git's "racily clean" rule). Entries live as small JSON files, one per identity, in `$RADIXCACHE_DIGEST_CACHE`,
else `~/.cache/radixcache/digests`; where neither can be written, digests are computed and not cached. A missing,
unreadable or garbled entry is recomputed. The folder keeps at most MAX_ENTRIES entries: a new one past that deletes
the oldest (by mtime) down to half, and only files named as entries are. An entry is written whole and synced
(radixcache.runtime.atomic_file). Plain `os` and `hashlib` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from pathlib import Path

from radixcache.runtime import atomic_file

_CHUNK = 8 << 20  # bytes hashed per read
_RACY_SECONDS = 2.0
_VERSION = 1
MAX_ENTRIES = 512  # past this many entries, a new one prunes the folder to the newest half
_ENTRY = re.compile(r"[0-9a-f]{32}\.json")


def digest_cache_dir() -> str | None:
    """`$RADIXCACHE_DIGEST_CACHE`, else `~/.cache/radixcache/digests`; None when the folder cannot be created."""
    explicit = os.environ.get("RADIXCACHE_DIGEST_CACHE")
    try:
        path = Path(explicit) if explicit else Path.home() / ".cache" / "radixcache" / "digests"
        path.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: no home at all (HOME unset, no passwd entry)
        return None
    return str(path)


def hash_file(path: str) -> str:
    """blake2b (16 bytes) of every byte of a file, in hex."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class DigestCache:
    """Content digests by file identity, in `directory` (None: nothing cached). `hashed` counts the files this
    instance read in full (tests and the measurement read it)."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.hashed = 0

    def content_digest(self, path: str) -> tuple[int, str]:
        """(size, digest of every byte) of a regular file, from the cache when its identity is unchanged."""
        st = os.stat(path)
        identity = _identity(path, st)
        entry = None
        if self.directory is not None:
            key = hashlib.blake2b(identity.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
            entry = os.path.join(self.directory, key + ".json")
            cached = _read_entry(entry, identity)
            if cached is not None:
                return st.st_size, cached
        digest = hash_file(path)
        self.hashed += 1
        unchanged = _identity(path, os.stat(path)) == identity  # not modified while it was read
        settled = time.time() - st.st_mtime_ns / 1e9 >= _RACY_SECONDS
        if entry is not None and unchanged and settled:
            _write_entry(entry, {"version": _VERSION, "identity": identity, "digest": digest})
            _prune(os.path.dirname(entry))
        return st.st_size, digest


def _identity(path: str, st: os.stat_result) -> str:
    stamps = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return "\0".join([os.path.realpath(path), *map(str, stamps)])


def _read_entry(entry: str, identity: str) -> str | None:
    try:
        with open(entry, encoding="utf-8", errors="surrogateescape") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or value.get("version") != _VERSION or value.get("identity") != identity:
        return None
    digest = value.get("digest")
    return digest if isinstance(digest, str) and len(digest) == 32 else None


def _prune(folder: str) -> None:
    """Keep the newest MAX_ENTRIES // 2 entries once there are more than MAX_ENTRIES; never raises."""
    try:
        entries = [e for e in os.scandir(folder) if _ENTRY.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
        if len(entries) <= MAX_ENTRIES:
            return
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
    except OSError:
        return
    for e in entries[: len(entries) - MAX_ENTRIES // 2]:
        with contextlib.suppress(OSError):
            os.unlink(e.path)


def _write_entry(entry: str, value: dict) -> None:
    """Write whole (radixcache.runtime.atomic_file: a kill or a crash leaves the earlier entry or the new one, and a
    killed writer's staging file goes with the next write of the entry); a failure only means no cache entry."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(entry), exist_ok=True)
        atomic_file.write_bytes(entry, json.dumps(value).encode("ascii"))  # ASCII: surrogates come out escaped
