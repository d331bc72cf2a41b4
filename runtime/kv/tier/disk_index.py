"""The disk store's index: which page files exist, their sizes, and their order of last use.

Built at open from file names and `stat` alone (no page is read), then kept by the store's own writes, reads and
deletions. Not thread-safe by itself: the store's lock guards every call.

Invariants: `bytes` is the sum of the entries' sizes; `tag_pages` / `tag_bytes` count the entries per fingerprint
tag, with no tag at zero; each entry's stamp is the mtime its file was given (or found with at open), so the order of
use in memory is the order a restart rebuilds; along a run, each page is older than the one before it.
"""

from __future__ import annotations

import heapq
import os
import stat
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from radixcache.runtime.kv.tier.disk_files import is_real_dir
from radixcache.runtime.kv.tier.disk_format import MAX_HASH_BYTES
from radixcache.runtime.kv.tier.disk_layout import CacheDir, in_own_folder

# Between the stamps of one run's consecutive pages (a file system keeping microseconds tells them apart).
STEP_NS = 1000


class PageEntry(NamedTuple):
    """One page of the index. Entries are compared by identity: a newer write of the same hash is a new one."""

    path: str
    size: int
    tag: str


class PageIndex:
    """page hash -> PageEntry, each with a stamp (its file's mtime, ns): the order of use, least recent first.

    A page can take its place anywhere in that order (`place`: a run's new page just older than the page before it),
    so the order is kept as a heap of (stamp, hash), an item stale once its page is dropped or stamped again; the heap
    is rebuilt when stale items outnumber the live ones."""

    def __init__(self) -> None:
        self._entries: dict[bytes, PageEntry] = {}
        self._stamps: dict[bytes, int] = {}
        self._heap: list[tuple[int, bytes]] = []
        self.bytes = 0
        self.tag_pages: dict[str, int] = {}
        self.tag_bytes: dict[str, int] = {}
        # Files left on disk that this index will not list again until a write of the page puts it back (`add`): a
        # newer format's page, or a corrupt or evicted one that could not be deleted (the store's lookups past the
        # index skip them, kv.tier.disk_store's count_prefix)
        self.left_out: set[str] = set()
        # Files whose reads failed (EIO, ESTALE: a bad sector, a network file system), how many times in a row
        # (kv.tier.disk_reads: READ_ERRORS_LIMIT in a row take a page out of the index)
        self.read_errors: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, page_hash: object) -> bool:
        return page_hash in self._entries

    def get(self, page_hash: bytes) -> PageEntry | None:
        return self._entries.get(page_hash)

    def order(self) -> list[bytes]:
        """The hashes, least recently used first (what the size limit deletes first)."""
        return sorted(self._stamps, key=lambda h: (self._stamps[h], h))

    def prefix_length(self, page_hashes: Iterable[bytes]) -> int:
        """How many of `page_hashes`, from the first, are present. O(answer)."""
        n = 0
        for page_hash in page_hashes:
            if page_hash not in self._entries:
                break
            n += 1
        return n

    def add(self, page_hash: bytes, entry: PageEntry, stamp: int) -> None:
        """Insert with its stamp (the hash must be absent: `replace` otherwise)."""
        self._entries[page_hash] = entry
        self.left_out.discard(entry.path)
        self.read_errors.pop(entry.path, None)
        self._set_stamp(page_hash, stamp)
        self.bytes += entry.size
        self.tag_pages[entry.tag] = self.tag_pages.get(entry.tag, 0) + 1
        self.tag_bytes[entry.tag] = self.tag_bytes.get(entry.tag, 0) + entry.size

    def replace(self, page_hash: bytes, entry: PageEntry, stamp: int) -> None:
        """Insert with its stamp, dropping whatever entry the hash had."""
        self.drop(page_hash)
        self.add(page_hash, entry, stamp)

    def drop(self, page_hash: bytes, entry: PageEntry | None = None) -> bool:
        """Remove a hash (only if it is still `entry`, when given). Returns whether it was removed."""
        current = self._entries.get(page_hash)
        if current is None or (entry is not None and current is not entry):
            return False
        del self._entries[page_hash], self._stamps[page_hash]
        self.bytes -= current.size
        self.tag_pages[current.tag] -= 1
        self.tag_bytes[current.tag] -= current.size
        if not self.tag_pages[current.tag]:
            del self.tag_pages[current.tag], self.tag_bytes[current.tag]
        return True

    def touch(self, page_hash: bytes, entry: PageEntry, stamp: int) -> None:
        """Stamp the page (its use: a read), if the hash is still `entry`."""
        if self._entries.get(page_hash) is entry:
            self._set_stamp(page_hash, stamp)

    def refresh(self, page_hashes: Sequence[bytes], head_ns: int) -> list[tuple[bytes, PageEntry, int]]:
        """A run used (head first): the pages held are stamped falling from `head_ns`, STEP_NS a page, so that the
        size limit deletes a run's later pages before those it starts with. Returns (hash, entry, stamp) of each."""
        held = [(h, e) for h in page_hashes if (e := self._entries.get(h)) is not None]
        out = [(h, e, head_ns - i * STEP_NS) for i, (h, e) in enumerate(held)]
        for page_hash, _, stamp in out:
            self._set_stamp(page_hash, stamp)
        return out

    def place(self, parent: bytes | None, now_ns: int) -> int | None:
        """The stamp of a page about to be written: `now_ns` when it starts a run (`parent` None), else just older than
        `parent`, the run's page before it, so that a run's head stays its newest page without the run being stamped
        again at each page a request adds (it keeps the recency of its last use). None when `parent` is not held: a
        run is found from its head, so the page would never be read (not worth writing)."""
        if parent is None:
            return now_ns
        parent_ns = self._stamps.get(parent)
        return None if parent_ns is None else parent_ns - STEP_NS

    def evict_over(self, max_bytes: int) -> list[PageEntry]:
        """Remove least recently used entries until the total is at most `max_bytes`, keeping at least one entry (the
        newest stamp: not always the page just written, which `place` stamps just older than its parent, so a run whose
        last use is older than every other page loses it at once); return the removed entries, whose files are to go."""
        victims: list[PageEntry] = []
        while self.bytes > max_bytes and len(self._entries) > 1:
            oldest = self._oldest()
            assert oldest is not None
            victim = self._entries[oldest[1]]
            self.drop(oldest[1], victim)
            victims.append(victim)
        return victims

    def clear(self) -> None:
        self._entries.clear()
        self._stamps.clear()
        self._heap.clear()
        self.bytes = 0
        self.tag_pages.clear()
        self.tag_bytes.clear()

    def _set_stamp(self, page_hash: bytes, stamp: int) -> None:
        self._stamps[page_hash] = stamp
        heap = self._heap
        heapq.heappush(heap, (stamp, page_hash))
        if len(heap) > 2 * len(self._stamps) + 64:  # mostly stale: rebuilt from the live stamps
            heap[:] = [(ns, h) for h, ns in self._stamps.items()]
            heapq.heapify(heap)

    def _oldest(self) -> tuple[int, bytes] | None:
        """The (stamp, hash) of the least recently used page (None: none), dropping the stale items above it."""
        heap, stamps = self._heap, self._stamps
        while heap and stamps.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0] if heap else None


def scan_pages(cache_dir: CacheDir) -> list[tuple[bytes, PageEntry, int]]:
    """Every page file of the directory whose name this store could have written, with its mtime (ns), least recently
    used (oldest mtime, then path) first. Other names are skipped: `verify` reports them, reads never find them."""
    found: list[tuple[int, str, bytes, PageEntry]] = []
    for tag, hash_hex, path in cache_dir.page_files():
        try:
            page_hash = bytes.fromhex(hash_hex)
            if not 1 <= len(page_hash) <= MAX_HASH_BYTES or not in_own_folder(hash_hex, path):
                continue
            st = os.stat(path)
        except (ValueError, OSError):
            continue
        found.append((st.st_mtime_ns, path, page_hash, PageEntry(path, st.st_size, tag)))
    found.sort(key=lambda item: (item[0], item[1]))
    return [(page_hash, entry, mtime_ns) for mtime_ns, _, page_hash, entry in found]


def probe_pages(cache_dir: CacheDir, page_hashes: Iterable[bytes]) -> list[tuple[bytes, PageEntry, int]]:
    """The page files of `page_hashes`, from the first, that are on disk under this fingerprint (regular files at their
    paths, in real folders, stopping at the first absent: one `lstat` a page and one a folder): pages another process
    sharing the directory wrote after this store's open, which its index does not list. No symlink is followed, as
    `scan_pages` follows none: a symlinked `pages/`, fingerprint or hash folder ends the run. (hash, entry, mtime)."""
    found: list[tuple[bytes, PageEntry, int]] = []
    real: dict[str, bool] = {}  # each folder's lstat, once a call
    for page_hash in page_hashes:
        path = cache_dir.page_path(page_hash)
        try:
            st = os.lstat(path)
        except OSError:
            break
        folders = (cache_dir.pages_root, cache_dir.pages_dir, os.path.dirname(path))
        for folder in folders:
            if folder not in real:
                real[folder] = is_real_dir(folder)
        if not (stat.S_ISREG(st.st_mode) and all(real[folder] for folder in folders)):
            break
        found.append((page_hash, PageEntry(path, st.st_size, cache_dir.tag), st.st_mtime_ns))
    return found


def clamp_future(found: list[tuple[bytes, PageEntry, int]], now_ns: int) -> list[tuple[str, int]]:
    """Bring the stamps of `found` (scan_pages' list, oldest first) that are later than `now_ns` back to it, in place:
    the newest to `now_ns`, each one before it STEP_NS older, so their order stays and every page written from now
    on is newer (files stamped while the clock ran ahead, then corrected, would otherwise look newest and outlive
    everything at the size limit). Returns the (path, ns) mtimes to give their files, so that the next open agrees."""
    due: list[tuple[str, int]] = []
    bound = now_ns
    for i in reversed(range(len(found))):
        page_hash, entry, mtime_ns = found[i]
        if mtime_ns <= bound:
            break  # sorted: every one before it is older still
        found[i] = (page_hash, entry, bound)
        due.append((entry.path, bound))
        bound -= STEP_NS
    return due
