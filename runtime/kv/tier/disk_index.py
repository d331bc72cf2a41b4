"""The disk store's index: which page files exist, their sizes, and their order of last use.

Built at open from file names and `stat` alone (no page is read), then kept by the store's own writes, reads and
deletions. Not thread-safe by itself: the store's lock guards every call.

Invariants: `bytes` is the sum of the entries' sizes; `tag_pages` / `tag_bytes` count the entries per fingerprint
tag, with no tag at zero; iteration order is least recently used first.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from radixcache.runtime.kv.tier.disk_format import MAX_HASH_BYTES
from radixcache.runtime.kv.tier.disk_layout import CacheDir, in_own_folder


class PageEntry(NamedTuple):
    """One page of the index. Entries are compared by identity: a newer write of the same hash is a new one."""

    path: str
    size: int
    tag: str


class PageIndex:
    """page hash -> PageEntry, least recently used first, with the byte total and the per-tag counts."""

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, PageEntry] = OrderedDict()
        self.bytes = 0
        self.tag_pages: dict[str, int] = {}
        self.tag_bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, page_hash: object) -> bool:
        return page_hash in self._entries

    def get(self, page_hash: bytes) -> PageEntry | None:
        return self._entries.get(page_hash)

    def prefix_length(self, page_hashes: Iterable[bytes]) -> int:
        """How many of `page_hashes`, from the first, are present. O(answer)."""
        n = 0
        for page_hash in page_hashes:
            if page_hash not in self._entries:
                break
            n += 1
        return n

    def add(self, page_hash: bytes, entry: PageEntry) -> None:
        """Insert as most recently used (the hash must be absent: `replace` otherwise)."""
        self._entries[page_hash] = entry
        self.bytes += entry.size
        self.tag_pages[entry.tag] = self.tag_pages.get(entry.tag, 0) + 1
        self.tag_bytes[entry.tag] = self.tag_bytes.get(entry.tag, 0) + entry.size

    def replace(self, page_hash: bytes, entry: PageEntry) -> None:
        """Insert as most recently used, dropping whatever entry the hash had."""
        self.drop(page_hash)
        self.add(page_hash, entry)

    def drop(self, page_hash: bytes, entry: PageEntry | None = None) -> bool:
        """Remove a hash (only if it is still `entry`, when given). Returns whether it was removed."""
        current = self._entries.get(page_hash)
        if current is None or (entry is not None and current is not entry):
            return False
        del self._entries[page_hash]
        self.bytes -= current.size
        self.tag_pages[current.tag] -= 1
        self.tag_bytes[current.tag] -= current.size
        if not self.tag_pages[current.tag]:
            del self.tag_pages[current.tag], self.tag_bytes[current.tag]
        return True

    def touch(self, page_hash: bytes, entry: PageEntry) -> None:
        """Make the hash the most recently used, if it is still `entry`."""
        if self._entries.get(page_hash) is entry:
            self._entries.move_to_end(page_hash)

    def refresh(self, page_hashes: Sequence[bytes]) -> None:
        """Make the hashes held the most recently used, the first last (it is deleted after the others)."""
        for page_hash in reversed(page_hashes):
            if page_hash in self._entries:
                self._entries.move_to_end(page_hash)

    def evict_over(self, max_bytes: int) -> list[PageEntry]:
        """Remove least recently used entries until the total is at most `max_bytes`, keeping at least one entry
        (the page just written, when called after a write); return the removed entries, whose files are to go."""
        victims: list[PageEntry] = []
        while self.bytes > max_bytes and len(self._entries) > 1:
            victim_hash, victim = next(iter(self._entries.items()))
            self.drop(victim_hash, victim)
            victims.append(victim)
        return victims

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
        self.tag_pages.clear()
        self.tag_bytes.clear()


def scan_pages(cache_dir: CacheDir) -> list[tuple[bytes, PageEntry]]:
    """Every page file of the directory whose name this store could have written, least recently used (oldest
    mtime, then path) first. Other names are skipped: `verify` reports them, reads never find them."""
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
    return [(page_hash, entry) for _, _, page_hash, entry in found]
