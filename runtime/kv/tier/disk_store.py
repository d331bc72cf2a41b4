"""The disk tier's page store: KV pages on disk, content-addressed by their chained page hash.

A restarted server finds the pages it wrote before. The store knows nothing of torch or of how a hash is made:
a page hash is opaque `bytes` (the runtime's 16-byte chained hash, whose root already fingerprints the model,
weight format, KV dtype, page size, layout, rope and namespace), the KV payload is plain `bytes`, and `meta` is a
small JSON-able dict (e.g. `{"dtype": "float32", "shape": [30, 2, 16, 3, 64]}`) that only the runtime interprets.

Directory layout::

    DIR/radixcache-cache.json                     the marker: {"format": "radixcache-kv-pages", "version": 1}
    DIR/pages/<tag>/fingerprint.json              {"fingerprint": "<the fingerprint string>"}
    DIR/pages/<tag>/<2 hex>/<hash hex>.kvpage     one page; <2 hex> is the hash's first byte
    DIR/tmp/<pid>-<random>.tmp                    a page being written (renamed into pages/ when complete)

`<tag>` is blake2b(fingerprint, digest_size=8) in hex: a directory shared by several models keeps each
fingerprint's pages apart, so that counting pages per fingerprint needs only the file names.

Each page file is self-describing and checksummed; its format is in radixcache.runtime.kv.tier.disk_format.

Invariants:

- A page file is only ever created complete: it is written under `tmp/` and `os.replace`d into place, so a
  reader never sees a partial page. A process killed mid-write leaves a temporary file, which the next open
  removes (unless the process that wrote it is still alive and the file is less than an hour old).
- `read` trusts nothing: magic, version, checksum, the hash recorded in the file, and the page's own tokens must
  all match, or the page is deleted, counted as corrupt, and the read is a miss.
- The index (hash -> file, size) is built at open from file names and `stat` alone, and then follows this
  store's own writes, reads and deletions. Its byte total is kept at or under `max_bytes` after every write by
  deleting the least recently used pages (last read or write; at open, the files' mtimes, which reads refresh).
- No call raises for I/O reasons. An open that cannot create or write the directory, and a write that fails
  (ENOSPC, EROFS, EACCES, ...), disable the store (`enabled = False`, one warning on the "radixcache.disk"
  logger): it accepts no more writes, but still serves the pages already on disk.
- A non-empty directory without the marker is never adopted (the store opens disabled), and `clear` refuses one,
  so nothing but a radixcache cache is ever deleted.

Several processes may share a directory (files are immutable, written atomically, verified on read), but each
enforces `max_bytes` over the pages it knows of: its own writes and what was there when it opened.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from radixcache.runtime.kv.tier.disk_format import (
    FORMAT_VERSION,
    MAGIC,
    MAX_HASH_BYTES,
    PAGE_SUFFIX,
    TMP_SUFFIX,
    CorruptPage,
    PageWrite,
    encode_page,
    pack_tokens,
    page_checksum,
    parse_page,
)

__all__ = [
    "FORMAT_VERSION",
    "MARKER_NAME",
    "DiskStore",
    "DiskStoreStats",
    "VerifyReport",
    "fingerprint_tag",
]

log = logging.getLogger("radixcache.disk")

MARKER_NAME = "radixcache-cache.json"
MARKER_FORMAT = "radixcache-kv-pages"
FINGERPRINT_FILE = "fingerprint.json"
_STALE_TMP_SECONDS = 3600.0  # a temporary file this old is left over, whoever wrote it


def fingerprint_tag(fingerprint: str) -> str:
    """The directory name of a fingerprint's pages: blake2b(fingerprint, digest_size=8) in hex."""
    return hashlib.blake2b(fingerprint.encode("utf-8"), digest_size=8).hexdigest()


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


class _Entry(NamedTuple):
    """One page of the index. Entries are compared by identity: a newer write of the same hash is a new one."""

    path: str
    size: int
    tag: str


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_json_atomic(path: str, value: Any, tmp_dir: str) -> None:
    tmp = os.path.join(tmp_dir, f"{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            json.dump(value, f)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False  # no such process (or no such pid at all)
    except (PermissionError, OSError):
        return True  # exists under another user (or cannot tell: keep the file)
    return True


class DiskStore:
    """Pages on disk, addressed by page hash, bounded by `max_bytes`, written by one background thread.

    Thread-safety: `count_prefix`, `read`, `put`, `stats` may be called from any thread while the writer thread
    writes; one lock guards the index, the queue and the counters, and no file I/O happens under it. No call
    raises for I/O reasons (see the module docstring); bad arguments (a hash that is not 1-64 bytes, token ids
    outside int64, a meta that is not JSON-able) raise ValueError / TypeError from `put`.

    directory: created if needed. max_bytes: the most bytes of page files kept (>= 0). fingerprint: recorded in
    every page this store writes, and the name its pages are counted under. max_pending: the most writes queued
    at once (0 drops every write). create: False opens an existing cache only (ValueError if `directory` is not
    one), writes nothing at open and accepts no writes: the CLI's way to inspect a directory.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int,
        fingerprint: str = "",
        max_pending: int = 256,
        create: bool = True,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_bytes = int(max_bytes)
        self.max_pending = int(max_pending)
        self.fingerprint = str(fingerprint)
        self.tag = fingerprint_tag(self.fingerprint)
        self.marker_path = os.path.join(self.directory, MARKER_NAME)
        self.pages_root = os.path.join(self.directory, "pages")
        self.pages_dir = os.path.join(self.pages_root, self.tag)  # this fingerprint's pages
        self.tmp_dir = os.path.join(self.directory, "tmp")

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a write finishes or the queue changes
        self._index: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._tag_pages: dict[str, int] = {}
        self._tag_bytes: dict[str, int] = {}
        self._names: dict[str, str] = {self.tag: self.fingerprint}  # tag -> fingerprint string
        self._pending: dict[bytes, PageWrite] = {}  # queued or being written
        self._queue: deque[bytes] = deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._warned = False
        self.enabled = True
        self._writes = self._dropped = self._hits = self._misses = self._corrupt = self._evicted = 0

        if create:
            self._open_for_writing()
        else:
            self._open_existing()

    # ----------------------------------------------------------------------------------------------- opening

    def _open_existing(self) -> None:
        """create=False: the directory must be a cache of this format; nothing is written."""
        if not os.path.isdir(self.directory):
            raise ValueError(f"{self.directory} does not exist or is not a directory")
        self._check_marker(strict=True)
        self.enabled = False  # an inspecting handle writes nothing
        self._scan()

    def _open_for_writing(self) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            self._disable(f"cannot create {self.directory}: {exc}")
            return
        try:
            has_marker = self._check_marker(strict=False)
        except ValueError as exc:
            self._disable(str(exc))
            return  # another format's directory: touch nothing, read nothing
        if not has_marker:
            try:
                others = [n for n in os.listdir(self.directory) if n not in ("pages", "tmp")]
            except OSError as exc:
                self._disable(f"cannot list {self.directory}: {exc}")
                return
            if others:
                self._disable(
                    f"{self.directory} is not empty and is not a radixcache cache (no {MARKER_NAME}): not using it"
                )
                return
        try:
            os.makedirs(self.tmp_dir, exist_ok=True)
            os.makedirs(self.pages_dir, exist_ok=True)
            if not has_marker:
                _write_json_atomic(self.marker_path, {"format": MARKER_FORMAT, "version": FORMAT_VERSION}, self.tmp_dir)
            name_file = os.path.join(self.pages_dir, FINGERPRINT_FILE)
            if not os.path.exists(name_file):
                _write_json_atomic(name_file, {"fingerprint": self.fingerprint}, self.tmp_dir)
            self._remove_leftovers()
            probe = os.path.join(self.tmp_dir, f"{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}")
            with open(probe, "xb"):
                pass
            os.unlink(probe)
        except OSError as exc:
            self._disable(f"cannot write to {self.directory}: {exc}")
        self._scan()  # a read-only cache still serves its pages

    def _check_marker(self, *, strict: bool) -> bool:
        """True when the marker is there and names this format. ValueError when it names another one (or, when
        `strict`, when it is missing)."""
        try:
            marker = _read_json(self.marker_path)
        except FileNotFoundError:
            if strict:
                raise ValueError(
                    f"{self.directory} is not a radixcache cache directory (it has no {MARKER_NAME})"
                ) from None
            return False
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.marker_path}: unreadable marker ({exc})") from None
        if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
            raise ValueError(f"{self.marker_path} is not a radixcache cache marker")
        if marker.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{self.directory} holds cache format version {marker.get('version')!r}; "
                f"this radixcache reads version {FORMAT_VERSION}"
            )
        return True

    def _remove_leftovers(self) -> None:
        """Delete temporary files a killed process left: those of dead processes, and any older than an hour."""
        now = time.time()
        try:
            entries = list(os.scandir(self.tmp_dir))
        except OSError:
            return
        for entry in entries:
            pid_text = entry.name.split("-", 1)[0]
            try:
                alive = pid_text.isdigit() and _pid_alive(int(pid_text))
                if alive and now - entry.stat().st_mtime < _STALE_TMP_SECONDS:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.debug("cannot remove the temporary file %s: %s", entry.path, exc)

    def _page_files(self) -> list[tuple[str, str, str]]:
        """(tag, hash hex, path) of every page file on disk, from directory listings alone."""
        found: list[tuple[str, str, str]] = []
        try:
            tags = [e for e in os.scandir(self.pages_root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return found
        for tag in tags:
            try:
                subdirs = [e for e in os.scandir(tag.path) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for sub in subdirs:
                try:
                    files = list(os.scandir(sub.path))
                except OSError:
                    continue
                found.extend(
                    (tag.name, f.name[: -len(PAGE_SUFFIX)], f.path) for f in files if f.name.endswith(PAGE_SUFFIX)
                )
        return found

    def _fingerprint_name(self, tag: str) -> str:
        """The fingerprint string of a tag, from its fingerprint.json ("?<tag>" when unreadable). Reads a file the
        first time: call it without the lock."""
        name = self._names.get(tag)
        if name is None:
            try:
                value = _read_json(os.path.join(self.pages_root, tag, FINGERPRINT_FILE))
                name = value["fingerprint"]
                if not isinstance(name, str) or fingerprint_tag(name) != tag:
                    raise ValueError(name)
            except (OSError, ValueError, KeyError, TypeError):
                name = f"?{tag}"
            self._names[tag] = name
        return name

    def _scan(self) -> None:
        """Build the index from names and stat, least recently used (oldest mtime) first."""
        found: list[tuple[int, str, bytes, _Entry]] = []
        for tag, hash_hex, path in self._page_files():
            try:
                page_hash = bytes.fromhex(hash_hex)
                if not 1 <= len(page_hash) <= MAX_HASH_BYTES or os.path.basename(os.path.dirname(path)) != hash_hex[:2]:
                    continue  # not a name this store writes: verify reports it, reads never find it
                st = os.stat(path)
            except (ValueError, OSError):
                continue
            found.append((st.st_mtime_ns, path, page_hash, _Entry(path, st.st_size, tag)))
        found.sort(key=lambda item: (item[0], item[1]))
        for tag in {entry.tag for *_, entry in found}:
            self._fingerprint_name(tag)
        with self._lock:
            for _, _, page_hash, entry in found:
                # One hash under two fingerprint strings (the same model named twice): the newer file wins; the
                # other stays on disk, outside the index (verify still checks it, clear still deletes it).
                self._drop(page_hash)
                self._add(page_hash, entry)

    # ------------------------------------------------------------------------------------------ index helpers

    def _add(self, page_hash: bytes, entry: _Entry) -> None:
        """Insert as most recently used. Caller holds the lock."""
        self._index[page_hash] = entry
        self._bytes += entry.size
        self._tag_pages[entry.tag] = self._tag_pages.get(entry.tag, 0) + 1
        self._tag_bytes[entry.tag] = self._tag_bytes.get(entry.tag, 0) + entry.size

    def _drop(self, page_hash: bytes, entry: _Entry | None = None) -> bool:
        """Remove from the index (only if it is still `entry`, when given). Caller holds the lock."""
        current = self._index.get(page_hash)
        if current is None or (entry is not None and current is not entry):
            return False
        del self._index[page_hash]
        self._bytes -= current.size
        self._tag_pages[current.tag] -= 1
        self._tag_bytes[current.tag] -= current.size
        if not self._tag_pages[current.tag]:
            del self._tag_pages[current.tag], self._tag_bytes[current.tag]
        return True

    def _disable(self, reason: str) -> None:
        """Stop accepting writes; warn once. Caller does not hold the lock."""
        with self._lock:
            self.enabled = False
            first, self._warned = not self._warned, True
        if first:
            log.warning("disk KV cache disabled: %s", reason)

    def _page_path(self, page_hash: bytes) -> str:
        hex_ = page_hash.hex()
        return os.path.join(self.pages_dir, hex_[:2], hex_ + PAGE_SUFFIX)

    # -------------------------------------------------------------------------------------------- lookups

    def count_prefix(self, page_hashes: Sequence[bytes]) -> int:
        """How many of `page_hashes`, from the first, are stored consecutively (per the index). O(answer)."""
        n = 0
        with self._lock:
            index = self._index
            for page_hash in page_hashes:
                if page_hash not in index:
                    break
                n += 1
        return n

    def __contains__(self, page_hash: object) -> bool:
        with self._lock:
            return page_hash in self._index

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def read(self, page_hash: bytes, tokens: Sequence[int]) -> tuple[bytes, dict] | None:
        """The page's payload and metadata, or None when it is absent or fails a check.

        `tokens` are the page's own token ids, compared with those stored: a hash alone is never trusted. A page
        that fails any check (magic, version, checksum, recorded hash, tokens, length) is deleted from disk and
        the index, counted in `corrupt_pages` and logged as a warning. A hit makes the page the most recently
        used, in memory and by its mtime (so that the order survives a restart).
        """
        with self._lock:
            entry = self._index.get(page_hash)
            if entry is None:
                self._misses += 1
                return None
        try:
            with open(entry.path, "rb") as f:
                data = f.read()
        except OSError as exc:
            with self._lock:
                if isinstance(exc, FileNotFoundError):  # deleted behind our back (a clear, another process)
                    self._drop(page_hash, entry)
                self._misses += 1
            if not isinstance(exc, FileNotFoundError):
                log.debug("cannot read %s: %s", entry.path, exc)
            return None
        try:
            page = parse_page(data)
            if page.hash_hex != page_hash.hex():
                raise CorruptPage(f"the file records hash {page.hash_hex:.64}")
            try:
                asked, _ = pack_tokens(tokens, page.token_width)
            except ValueError:
                asked = b""
            if asked != page.tokens:
                raise CorruptPage("its tokens differ from the page's")
        except CorruptPage as exc:
            self._corrupt_found(page_hash, entry, str(exc))
            return None
        with self._lock:
            if self._index.get(page_hash) is entry:
                self._index.move_to_end(page_hash)
            self._hits += 1
        with contextlib.suppress(OSError):
            os.utime(entry.path)
        return page.payload, page.meta

    def _corrupt_found(self, page_hash: bytes, entry: _Entry, reason: str) -> None:
        log.warning("disk KV cache: deleting the corrupt page %s: %s", entry.path, reason)
        with contextlib.suppress(OSError):
            os.unlink(entry.path)
        with self._lock:
            self._drop(page_hash, entry)
            self._corrupt += 1
            self._misses += 1

    # --------------------------------------------------------------------------------------------- writes

    def put(self, page_hash: bytes, tokens: Sequence[int], payload: bytes, meta: dict) -> bool:
        """Queue an asynchronous write of a page; never blocks on I/O.

        Returns False, counting a dropped write, when the store is disabled or closed, when the page is already
        stored or queued, when `max_pending` writes are queued, or when the page alone exceeds `max_bytes`.
        Serializes the header here, so a hash that is not 1-64 bytes, token ids outside int64 or a meta that is
        not JSON-able raise ValueError / TypeError at once. A write that later fails disables the store.
        """
        write = encode_page(page_hash, self.fingerprint, tokens, payload, meta)
        key = write.page_hash
        with self._lock:
            if (
                self._closed
                or not self.enabled
                or key in self._index
                or key in self._pending
                or len(self._pending) >= self.max_pending
                or write.size > self.max_bytes
            ):
                self._dropped += 1
                return False
            self._pending[key] = write
            self._queue.append(key)
            self._changed.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="radixcache-disk-writer", daemon=True)
                self._thread.start()
        return True

    def _run(self) -> None:
        """The writer thread: one queued write at a time, until close."""
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                key = self._queue.popleft()
                write = self._pending[key]
                enabled = self.enabled
            entry: _Entry | None = None
            if enabled:
                try:
                    entry = self._write_page(write)
                except OSError as exc:
                    self._disable(f"writing a page failed: {exc}")
                except Exception:  # a bug must not kill the writer and leave flush() waiting forever
                    log.exception("disk KV cache: unexpected error writing a page")
            victims: list[_Entry] = []
            with self._lock:
                if entry is None:
                    self._dropped += 1
                else:
                    old = self._index.get(key)
                    if old is not None:
                        self._drop(key, old)  # read after a clear, say: the file was just replaced
                    self._add(key, entry)
                    self._writes += 1
                    while self._bytes > self.max_bytes and len(self._index) > 1:
                        victim_hash, victim = next(iter(self._index.items()))
                        self._drop(victim_hash, victim)
                        self._evicted += 1
                        victims.append(victim)
            for victim in victims:
                try:
                    os.unlink(victim.path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    self._disable(f"cannot delete {victim.path} to stay under max_bytes: {exc}")
            with self._lock:
                del self._pending[key]  # only now: flush() also waits for the evictions a write caused
                self._changed.notify_all()

    def _write_page(self, write: PageWrite) -> _Entry:
        """Write one page file: a temporary file, then an atomic rename into place. Raises OSError."""
        path = self._page_path(write.page_hash)
        digest = page_checksum(write.prefix, write.tokens, write.payload)
        for attempt in (0, 1):
            tmp = os.path.join(self.tmp_dir, f"{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}")
            try:
                with open(tmp, "xb") as f:
                    f.write(MAGIC)
                    f.write(digest)
                    f.write(write.prefix)
                    f.write(write.tokens)
                    f.write(write.payload)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.replace(tmp, path)
                return _Entry(path, write.size, self.tag)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                if attempt or exc.errno != errno.ENOENT:
                    raise
                # A directory vanished (a `cache clear`, an rm -r): recreate it once.
                os.makedirs(self.tmp_dir, exist_ok=True)
                os.makedirs(self.pages_dir, exist_ok=True)
                name_file = os.path.join(self.pages_dir, FINGERPRINT_FILE)
                if not os.path.exists(name_file):
                    _write_json_atomic(name_file, {"fingerprint": self.fingerprint}, self.tmp_dir)
        raise AssertionError("unreachable")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done (True), or `timeout` seconds passed (False)."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush (up to `timeout`), then stop the writer; later puts are dropped. Writes still queued after the
        timeout are discarded. Returns whether the flush completed. Idempotent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        flushed = self.flush(timeout)
        with self._lock:
            self._closed = True
            for key in self._queue:
                self._pending.pop(key, None)
                self._dropped += 1
            self._queue.clear()
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return flushed

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- maintenance

    def stats(self) -> DiskStoreStats:
        """A snapshot of the index and the counters."""
        with self._lock:
            names = {tag: self._names.get(tag, f"?{tag}") for tag in self._tag_pages}
            return DiskStoreStats(
                directory=self.directory,
                pages=len(self._index),
                bytes=self._bytes,
                max_bytes=self.max_bytes,
                enabled=self.enabled,
                pending_writes=len(self._pending),
                writes=self._writes,
                dropped_writes=self._dropped,
                read_hits=self._hits,
                read_misses=self._misses,
                corrupt_pages=self._corrupt,
                evicted_pages=self._evicted,
                fingerprints={names[tag]: n for tag, n in sorted(self._tag_pages.items())},
                fingerprint_bytes={names[tag]: n for tag, n in sorted(self._tag_bytes.items())},
            )

    def verify(self, *, delete: bool = True) -> VerifyReport:
        """Read and check every page file on disk: magic, version, checksum, header, length, that the recorded
        hash is the file's name (and sits in its first byte's folder), and that the recorded fingerprint is its
        folder's. Corrupt files are deleted (and leave the index) when `delete`. Never raises for I/O reasons;
        a file that cannot be read counts as corrupt, one that cannot be deleted as not removed."""
        checked = ok = removed = 0
        corrupt: list[str] = []
        reasons: list[str] = []
        for tag, hash_hex, path in self._page_files():
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue  # deleted meanwhile (an eviction)
            except OSError as exc:
                data, error = b"", f"unreadable ({exc})"
            else:
                error = ""
            checked += 1
            if not error:
                try:
                    page = parse_page(data)
                    if page.hash_hex != hash_hex or os.path.basename(os.path.dirname(path)) != hash_hex[:2]:
                        raise CorruptPage(f"the file records hash {page.hash_hex:.64}, its name says {hash_hex:.64}")
                    if fingerprint_tag(page.fingerprint) != tag:
                        raise CorruptPage("the file's fingerprint is not its folder's")
                    bytes.fromhex(hash_hex)
                except (CorruptPage, ValueError) as exc:
                    error = str(exc)
            if not error:
                ok += 1
                continue
            corrupt.append(path)
            reasons.append(error)
            log.warning("disk KV cache: corrupt page %s: %s", path, error)
            with self._lock:
                self._corrupt += 1
            if not delete:
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("disk KV cache: cannot delete %s: %s", path, exc)
                continue
            removed += 1
            with self._lock, contextlib.suppress(ValueError):
                page_hash = bytes.fromhex(hash_hex)
                entry = self._index.get(page_hash)
                if entry is not None and entry.path == path:
                    self._drop(page_hash, entry)
        return VerifyReport(checked=checked, ok=ok, corrupt=tuple(corrupt), removed=removed, reasons=tuple(reasons))

    def clear(self) -> int:
        """Delete every page file and temporary file (and discard queued writes); return how many pages.

        Raises ValueError naming the directory when it lacks the marker file (it is not a radixcache cache) or
        holds another format; OSError when a file cannot be deleted. A write already in progress may still land.
        """
        try:
            self._check_marker(strict=True)
        except ValueError as exc:
            raise ValueError(f"refusing to clear {self.directory}: {exc}") from None
        with self._lock:
            for key in self._queue:
                self._pending.pop(key, None)
                self._dropped += 1
            self._queue.clear()
            self._changed.notify_all()
        count = 0
        for _, _, path in self._page_files():
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            count += 1
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.tmp_dir):
                if entry.name.endswith(TMP_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        for folder in self._hash_folders():
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only empty ones go
        with self._lock:
            self._index.clear()
            self._bytes = 0
            self._tag_pages.clear()
            self._tag_bytes.clear()
        return count

    def _hash_folders(self) -> list[str]:
        """The <2 hex> folders under every fingerprint folder."""
        out: list[str] = []
        try:
            tags = [e.path for e in os.scandir(self.pages_root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return out
        for tag in tags:
            with contextlib.suppress(OSError):
                out.extend(e.path for e in os.scandir(tag) if e.is_dir(follow_symlinks=False))
        return out

    def __repr__(self) -> str:
        return f"DiskStore({self.directory!r}, max_bytes={self.max_bytes}, enabled={self.enabled})"
