"""Replacing a file whole: every file the project writes for a user (a saved session, a trace, a recording, a kernel
plan, a native build) goes through here, so a reader (or a process started after a crash) sees the earlier file or
the new one, never one cut short.

- The new content goes to a staging file beside the target, `.NAME.<pid>-<8 hex>.partial` (`.NAME.<pid>.partial`
  for a recording, one per process: `Staging(unique=False)`), created with the umask's default mode and flocked by
  this process while it lasts. Where that name would pass the folder's longest file name (255 bytes), `~<16 hex>`
  of NAME's hash stands for NAME in it, so a name the file system takes never fails for its staging file's.
- `commit` fsyncs the staging file, gives it an existing target's permission bits, `os.replace`s it onto the target
  and fsyncs the folder (POSIX), so after a crash the target is the old file or the new one, whole.
- A staging file that a killed process left is recognisable by its name and removed by the next `Staging` of the
  same target: one whose pid runs no more and that no process holds locked (a writer on another machine sharing the
  folder holds its lock). This process's own are kept too (a container's pid 1 is reused across restarts).
- A symlink's target is replaced (the link stays), as opening the link for writing would write it; a hard link is
  broken (its other names keep the earlier content: opening the file for writing would have emptied them). A target
  that exists and is no regular file (a pipe, /dev/stdout, /dev/null) is written directly: there is nothing to keep
  and no rename onto it.
- Errors are OSErrors that name the path the caller gave, never the staging file: a full disk while writing or
  syncing (ENOSPC, which a write reports without a file name) says which file it was.

The disk tier's page files have their own writes (runtime/kv/tier/disk_files.py: temporary files in the cache's
`tmp/`, no symlink followed, a page's mtime set), synced the same way. Plain `os` only (no torch).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator

PARTIAL = ".partial"
_PID = re.compile(r"([0-9]+)(?:-[0-9a-f]{8})?")  # what lies between `.NAME.` and `.partial`


def staging_stem(folder: str, name: str, tail: str) -> str:
    """What stands for the target's file `name` in the name of its staging file `.STEM.<tail>.partial`: `name`, or
    its hash where the staging file's name would be too long for `folder`."""
    if len(os.fsencode(f".{name}.{tail}{PARTIAL}")) <= name_max(folder):
        return name
    return _hashed(name)


def name_max(folder: str) -> int:
    """The longest file name (in bytes) `folder`'s file system takes: 255 on the common ones."""
    try:
        return os.pathconf(folder or ".", "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or the folder cannot tell
        return 255


def _hashed(name: str) -> str:
    return "~" + hashlib.blake2b(os.fsencode(name), digest_size=8).hexdigest()


class Staging:
    """A staging file for the file at `path` (see the module docstring): `path` is where the writer writes (the
    target itself when `direct`), `commit` moves it onto the target, `discard` removes it, `close` releases its lock.
    Making one removes the target's stale staging files. Raises OSError naming `path` (a missing folder, no
    permission)."""

    def __init__(self, path: str | os.PathLike[str], *, unique: bool = True) -> None:
        self.named = os.fspath(path)  # as the caller gave it: what errors name
        self.target = os.path.realpath(path)  # a symlink's target is replaced, as opening it for writing would
        self.direct = os.path.exists(self.target) and not os.path.isfile(self.target)
        self.fd: int | None = None
        self.committed = False
        if self.direct:
            self.path = self.target
            return
        folder, name = os.path.split(self.target)
        remove_stale_partials(folder, name)
        tail = f"{os.getpid()}-{secrets.token_hex(4)}" if unique else str(os.getpid())
        self.path = os.path.join(folder, f".{staging_stem(folder, name, tail)}.{tail}{PARTIAL}")
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if unique else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
        try:
            self.fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise _naming(exc, self.named) from None
        _try_lock(self.fd)

    def commit(self) -> None:
        """fsync the staging file, give it the target's permission bits (where there is one), move it onto the
        target and fsync the folder. Raises OSError naming the target (the staging file is left for `discard`)."""
        if self.direct:
            return
        try:
            self.sync()
            with contextlib.suppress(FileNotFoundError):  # no earlier file: the umask's default stays
                os.chmod(self.path, stat.S_IMODE(os.stat(self.target).st_mode))
            os.replace(self.path, self.target)
            self.committed = True
            fsync_dir(os.path.dirname(self.target))
        except OSError as exc:
            raise _naming(exc, self.named) from None

    def sync(self) -> None:
        """fsync what the staging file (or, once committed, the target) holds: through the locked descriptor, or the
        file now there where the writer replaced it (a linker's output). Raises OSError."""
        if self.direct:
            return
        where = self.target if self.committed else self.path
        if self.fd is not None and _same_file(self.fd, where):
            os.fsync(self.fd)
            return
        fd = os.open(where, os.O_RDWR if os.name == "nt" else os.O_RDONLY)  # Windows commits writable ones only
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def discard(self) -> None:
        """Remove the staging file (never the target a `direct` one writes)."""
        if not self.direct:
            with contextlib.suppress(OSError):
                os.remove(self.path)

    def close(self) -> None:
        """Release the lock (a later start may then take a staging file left here for stale)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@contextlib.contextmanager
def staged(path: str | os.PathLike[str]) -> Iterator[str]:
    """The file to write `path` through (a `Staging`'s): committed onto `path` once the block succeeds, removed if
    it fails (an error, Ctrl-C, a refused record), so a failed write leaves the earlier file whole. The block's
    OSErrors that name the staging file name `path` instead."""
    staging = Staging(path)
    try:
        try:
            yield staging.path
        except OSError as exc:
            if exc.filename != staging.path:
                raise
            raise _naming(exc, staging.named) from None
        staging.commit()
    except BaseException:
        staging.discard()
        raise
    finally:
        staging.close()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """`data` as the whole file at `path` (`staged`). Raises OSError naming `path` (ENOSPC, EFBIG, EACCES...)."""
    with staged(path) as staging:
        try:
            with open(staging, "wb") as f:
                f.write(data)
        except OSError as exc:  # a write's error names no file: '[Errno 28] No space left on device'
            raise _naming(exc, os.fspath(path)) from None


def fsync_dir(folder: str) -> None:
    """Make a folder's entries (a rename) durable. Nothing where folders cannot be opened (Windows; a folder this
    user may write but not read) or synced (EINVAL, ENOTSUP: some network and FUSE file systems), as SQLite does:
    the rename itself happened. Raises OSError for the rest (EIO, ENOSPC)."""
    if os.name == "nt":
        return
    try:
        fd = os.open(folder or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def remove_stale_partials(folder: str, name: str) -> list[str]:
    """Remove the staging files of the target `name` in `folder` that killed processes left (named after it or
    after its hash), and return their paths. A staging file is stale when the pid in its name runs no more and no
    process holds its lock (a writer on another machine that shares the folder). Kept: this process's own, any whose
    pid runs (whatever that process is now: a reused pid keeps a stale file for a later start, never risks a live
    write's), and any that is locked."""
    prefixes = (f".{name}.", f".{_hashed(name)}.")
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return []
    removed = []
    for entry in entries:
        prefix = next((p for p in prefixes if entry.startswith(p)), "")
        m = _PID.fullmatch(entry[len(prefix) : -len(PARTIAL)]) if prefix and entry.endswith(PARTIAL) else None
        if m is None:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _pid_alive(pid):
            continue
        stale = os.path.join(folder, entry)
        if _remove_unlocked(stale):
            removed.append(stale)
    return removed


def scratch(prefix: str) -> tuple[int, str]:
    """A private temporary file (mkstemp's: 0600, never an existing file or link) in the system's temporary folder,
    `<prefix><pid>-<random>.partial`, and its descriptor, which holds its lock: close it after removing the file.
    Removes first this user's files of that naming that killed processes left (pid dead, no lock held)."""
    folder = tempfile.gettempdir()
    named = re.compile(re.escape(prefix) + r"([0-9]+)-[A-Za-z0-9_]+" + re.escape(PARTIAL))
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            m = named.fullmatch(entry.name)
            if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():  # another user's is not ours to judge
                _remove_unlocked(entry.path)
    fd, path = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}-", suffix=PARTIAL, dir=folder)
    _try_lock(fd)
    return fd, path


def _remove_unlocked(path: str) -> bool:
    """Remove the regular file `path` unless a process holds its lock; whether it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False  # gone (committed, or removed by another start), or not a plain file of ours
    try:
        if _try_lock(fd):
            os.remove(path)
            return True
    except OSError:
        pass  # not ours to remove (a read-only folder): it stays
    finally:
        os.close(fd)
    return False


def _naming(exc: OSError, path: str) -> OSError:
    """`exc` naming `path` (its own subclass: FileNotFoundError, PermissionError...)."""
    if exc.strerror is None:
        return exc
    return OSError(exc.errno, exc.strerror, path)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":
        return True  # os.kill(pid, 0) there terminates the process (TerminateProcess): keep every file instead
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False  # no such process (or no such pid at all)
    except OSError:
        return True  # it runs under another user (PermissionError), or cannot tell: keep its file
    return True


def _try_lock(fd: int) -> bool:
    """Take an exclusive flock on `fd` without waiting: False when another process holds one. (No fcntl, as on
    Windows, or no locks on its file system: True, and the pid alone decides.)"""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True  # the file system takes no locks (ENOLCK): the pid alone decides
    return True
