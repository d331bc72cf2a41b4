"""The disk tier's file operations that keep a cache directory crash-safe and keep it to its own files: durable
atomic writes (temporary file, fsync, rename, fsync of the folder), reads and listings that never follow a symlink,
and the exact names the store gives its temporary files, the only ones it ever deletes from `tmp/`.

Plain `os` only. Every function raises OSError for I/O reasons (ELOOP / ENOTDIR for a symlink where a file or a
folder of ours should be); the callers decide what a failure means.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from radixcache.runtime.kv.tier.disk_format import TMP_SUFFIX

T = TypeVar("T")

# <pid>-<16 hex>.tmp: what temp_name makes. Nothing else in tmp/ is the store's, whatever its name ends with.
TMP_NAME = re.compile(r"([0-9]+)-[0-9a-f]{16}\.tmp")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # no effect on a regular file's reads
_PREADV = getattr(os, "preadv", None)
_IOV_MAX = 1024  # Linux's IOV_MAX: a read into more buffers takes several calls
FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})  # a full disk, a user's quota


_WRITING: set[str] = set()  # the temporary files this process is writing now (`live_temp`), by name


def temp_name() -> str:
    """A fresh temporary file name, led by this process's id (so cleanup can tell whether its writer lives)."""
    return f"{os.getpid()}-{secrets.token_hex(8)}{TMP_SUFFIX}"


@contextlib.contextmanager
def live_temp(tmp_dir: str) -> Iterator[str]:
    """A fresh temporary file's path in `tmp_dir`, known to this process as being written until the block ends."""
    name = temp_name()
    _WRITING.add(name)
    try:
        yield os.path.join(tmp_dir, name)
    finally:
        _WRITING.discard(name)


def writer_gone(name: str, pid: int) -> bool:
    """Whether the process that named temporary file `name` (`pid`, from its name) is no longer writing it: dead, or
    this very process not writing it now (a pid reused across a restart: a container's server is often pid 1 each
    time, and a file it left before a kill -9 looks like this process's)."""
    return name not in _WRITING if pid == os.getpid() else not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False  # no such process (or no such pid at all)
    except (PermissionError, OSError):
        return True  # exists under another user (or cannot tell: keep the file)
    return True


def temp_writer_pid(name: str) -> int | None:
    """The pid a temporary file's name records, or None when the name is not one `temp_name` makes."""
    m = TMP_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


def is_real_dir(path: str) -> bool:
    """Whether `path` is a folder itself, not a symlink to one (lstat). False when it does not exist."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def fsync_dir(path: str) -> None:
    """Make a folder's entries (a rename, a new file) durable. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | _DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_dir_nofollow(path: str) -> int:
    """A descriptor of the folder `path`, refusing a symlink as its last component (ELOOP / ENOTDIR)."""
    return os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)


def read_nofollow(path: str) -> bytes:
    """A regular file's bytes, refusing a symlink as its last component. Raises OSError."""
    with _open_regular(path) as (f, _):
        return f.readall()


def read_nofollow_with(path: str, consume: Callable[[io.FileIO, int], T]) -> T:
    """`consume(file, size)` of a regular file opened unbuffered without following a symlink: a reader that takes
    the bytes as it needs them (a stream, not the whole file in memory). Raises OSError."""
    with _open_regular(path) as (f, size):
        return consume(f, size)


def read_nofollow_writable(path: str) -> bytearray:
    """`read_nofollow` into a bytearray (one copy, from the page cache: a tensor can then view the bytes without
    copying them again). A file that changes size while read yields what was there. Raises OSError."""
    with _open_regular(path) as (f, size):
        data = bytearray(size + 1)  # one byte more: a file grown since fstat shows as longer, not cut
        got = _read_fully(f, memoryview(data))
    del data[got:]
    return data


def read_nofollow_into(path: str, buffer: bytearray) -> memoryview:
    """`read_nofollow` into `buffer`, grown when the file is larger (never shrunk: a caller that reads many files
    keeps one, so that a read allocates, zeroes and faults in no new memory); returns a writable view of the bytes
    read, valid until `buffer`'s next use. A file that changes size while read yields what was there. Raises
    OSError."""
    with _open_regular(path) as (f, size):
        need = size + 1  # as above
        if len(buffer) < need:
            buffer.extend(bytes(need - len(buffer)))
        view = memoryview(buffer)[:need]
        return view[: _read_fully(f, view)]


# read_nofollow_split's shape: (path, head, rows) -> (the head's bytes, the body's checksum if the read made it)
SplitRead = Callable[[str, bytearray, Sequence[memoryview]], "tuple[memoryview, bytes | None] | None"]


def read_nofollow_split(path: str, head: bytearray, rows: Sequence[memoryview]) -> tuple[memoryview, None] | None:
    """A regular file (no symlink followed) read in one vectored read: its last `sum(len(rows))` bytes straight
    into `rows`, in order, and the bytes before them into `head` (grown as needed, never shrunk); returns the view
    of `head` that holds those, and None for the checksum (kv.tier.native_reads' read makes it as it reads). None,
    having read nothing, when the file is shorter than the rows. The disk tier's page reads: a page's payload lands
    in its staging memory with no copy through a buffer. Raises OSError, also when the file shrinks while read."""
    payload = sum(len(row) for row in rows)
    with _open_regular(path) as (f, size):
        if size < payload:
            return None
        if len(head) < size - payload:
            head.extend(bytes(size - payload - len(head)))
        head_view = memoryview(head)[: size - payload]
        if _preadv_fully(f, [head_view, *rows]) < size:
            raise OSError(errno.EIO, f"{path} shrank while read")
        return head_view, None


def _preadv_fully(f: io.FileIO, views: list[memoryview]) -> int:
    """Fill `views` in order from the start of `f` (a few buffers per call, at most IOV_MAX); the bytes read,
    fewer only where the file ends first."""
    got = 0
    views = [v for v in views if len(v)]
    while views:
        # without a vectored read here, one buffer at a time (the file's position is `got`: nothing else reads it)
        n = f.readinto(views[0]) if _PREADV is None else _PREADV(f.fileno(), views[:_IOV_MAX], got)
        if not n:
            break
        got += n
        while views and n >= len(views[0]):
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]
    return got


@contextlib.contextmanager
def _open_regular(path: str) -> Iterator[tuple[io.FileIO, int]]:
    """The file at `path` (no symlink followed), unbuffered, and its size; OSError unless a regular file."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)  # a FIFO in a file's place must not block the open
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(f"{path} is not a regular file")
        yield f, info.st_size  # type: ignore[misc]


def _read_fully(f: io.FileIO, view: memoryview) -> int:
    """Read into `view` until it is full or the file ends; the bytes read."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def read_json(path: str) -> Any:
    """A JSON file's value (no symlink followed). OSError, or ValueError for bad JSON."""
    return json.loads(read_nofollow(path).decode("utf-8"))


def write_durable(
    tmp_dir: str,
    path: str,
    chunks: Iterator[bytes] | list[bytes],
    *,
    sync_parent: bool = False,
    mtime_ns: int | None = None,
    unplace_on_failure: bool = False,
) -> None:
    """Write `chunks` to a fresh temporary file in `tmp_dir` (its atime and mtime `mtime_ns`, when given), fsync it,
    rename it to `path`, fsync `path`'s folder (and that folder's parent when `sync_parent`: the folder is new). The
    temporary file is removed on failure; with `unplace_on_failure`, so is `path` when a folder's fsync fails after
    the rename (ENOSPC, EIO), so a caller that counts the write as failed keeps its index equal to the directory.
    `tmp_dir` and `path`'s folder must be on one filesystem. Raises OSError."""
    with live_temp(tmp_dir) as tmp:
        try:
            with open(tmp, "xb") as f:  # O_EXCL: never opens an existing file or symlink
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                if mtime_ns is not None:
                    os.utime(f.fileno(), ns=(mtime_ns, mtime_ns))
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    folder = os.path.dirname(path)
    try:
        fsync_dir(folder)
        if sync_parent:
            fsync_dir(os.path.dirname(folder))
    except OSError:
        if unplace_on_failure:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise


def write_json_durable(path: str, value: Any, tmp_dir: str) -> None:
    write_durable(tmp_dir, path, [json.dumps(value).encode("utf-8") + b"\n"])


def own_temp_files(tmp_dir: str) -> tuple[int, list[tuple[str, int, float]]] | None:
    """Open `tmp_dir` without following a symlink and list the regular files named as `temp_name` makes them:
    (folder descriptor, [(name, pid, mtime)]). None when it is not a real folder or cannot be read. The caller
    closes the descriptor and unlinks relative to it (`dir_fd`), so a folder swapped for a symlink meanwhile is
    never entered."""
    try:
        fd = open_dir_nofollow(tmp_dir)
    except OSError:
        return None
    found: list[tuple[str, int, float]] = []
    try:
        for name in os.listdir(fd):
            pid = temp_writer_pid(name)
            if pid is None:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((name, pid, st.st_mtime))
    except OSError:
        os.close(fd)
        return None
    return fd, found
