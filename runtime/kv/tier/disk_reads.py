"""Reading one page file and checking it: the two reads the disk store serves (kv.tier.disk_store: `read`, whole, and
`read_into`, the payload straight into the caller's buffers), and what a read means for the store's index
(`read_indexed`). The loads raise OSError for I/O and CorruptPage for a file that fails a check
(kv.tier.disk_format); `read_indexed` turns either into a miss."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from radixcache.runtime.kv.tier.disk_files import SplitRead, read_nofollow_into, read_nofollow_writable
from radixcache.runtime.kv.tier.disk_format import CorruptPage, NewerPage, check_split_page_for, parse_page_for
from radixcache.runtime.kv.tier.disk_index import PageIndex

log = logging.getLogger("radixcache.disk")
T = TypeVar("T")

READ_ERRORS_LIMIT = 3  # reads of one page file failing in a row (EIO and the like) that take it out of the index


def load_page(path: str, page_hash: bytes, tokens: Sequence[int]) -> tuple[memoryview, dict]:
    """The page's payload (a writable view of the bytes read) and meta."""
    page = parse_page_for(read_nofollow_writable(path), page_hash, tokens)
    return page.payload, page.meta


def load_page_into(
    path: str, page_hash: bytes, tokens: Sequence[int], payload: Sequence[memoryview], head: bytearray, split: SplitRead
) -> dict | None:
    """The page's meta, its payload read into `payload` by `split` (the rest of the file into `head`, and the
    checksum of its body when `split` made it); None for a sound page whose payload is not `payload`'s length."""
    got = split(path, head, payload)
    if got is not None:
        return check_split_page_for(got[0], payload, page_hash, tokens, got[1])
    page = parse_page_for(read_nofollow_into(path, head), page_hash, tokens)  # shorter than `payload`
    return page.meta if len(page.payload) == sum(len(p) for p in payload) else None


def read_indexed(
    index: PageIndex,
    lock: threading.Lock,
    count: dict[str, int],
    page_hash: bytes,
    load: Callable[[str], T | None],
    mtime_ns: int | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> T | None:
    """The read of one page: `load(path)` reads and checks its file (raising OSError or CorruptPage, or
    returning None for a page that is sound but not what the caller can use); here the index, the counters,
    the deletion of a corrupt page and the refresh of its use: stamped `mtime_ns`, or `clock()` (called under
    `lock`), in the index and as its file's mtime. `lock` guards `index` and `count`."""
    with lock:
        entry = index.get(page_hash)
        if entry is None:
            count["read_misses"] += 1
            return None
    try:
        got = load(entry.path)
    except OSError as exc:
        gone = isinstance(exc, FileNotFoundError)  # deleted behind our back (a clear, another process)
        # EACCES, EPERM: its mode changed under the cache (another user's file): every later read fails as this one.
        # EIO and the like may pass: the page is kept, until READ_ERRORS_LIMIT reads of it in a row failed (a bad
        # sector). Either way then out of the index, not found past it again, and the page recomputed is written in
        # its place (a new file).
        denied = isinstance(exc, PermissionError)
        with lock:
            failed = 0 if gone or denied else index.read_errors.get(entry.path, 0) + 1
            if failed:
                index.read_errors[entry.path] = failed
            left = denied or failed >= READ_ERRORS_LIMIT
            if gone or left:
                index.drop(page_hash, entry)
            if left:
                index.left_out.add(entry.path)
                index.read_errors.pop(entry.path, None)
            count["read_misses"] += 1
        if left:
            log.warning("disk KV cache: cannot read %s (%s); recomputing it, then writing it again", entry.path, exc)
        elif not gone:
            log.debug("cannot read %s: %s", entry.path, exc)
        return None
    except NewerPage as exc:  # a newer radixcache's page: left for it, out of this store's index
        log.debug("disk KV cache: skipping %s: %s", entry.path, exc)
        with lock:
            index.drop(page_hash, entry)
            index.left_out.add(entry.path)
            count["read_misses"] += 1
        return None
    except CorruptPage as exc:
        log.warning("disk KV cache: deleting the corrupt page %s: %s", entry.path, exc)
        kept = False
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            pass
        except OSError:
            kept = True  # never served (it fails its checks), nor listed again by a lookup past the index
        with lock:
            index.drop(page_hash, entry)
            if kept:
                index.left_out.add(entry.path)
            count["corrupt_pages"] += 1
            count["read_misses"] += 1
        return None
    if got is None:
        with lock:
            count["read_misses"] += 1
        return None
    with lock:
        stamp = clock() if mtime_ns is None else mtime_ns
        index.touch(page_hash, entry, stamp)
        count["read_hits"] += 1
        if index.read_errors:  # the errors in a row end
            index.read_errors.pop(entry.path, None)
    with contextlib.suppress(OSError):
        os.utime(entry.path, ns=(stamp, stamp))
    return got
