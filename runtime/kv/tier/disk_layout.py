"""The disk tier's directory: where each file lives, the marker that makes a directory a radixcache cache, and the
cleanup of what a killed process left behind. Plain files and `os` only (no torch, no threads).

Directory layout::

    DIR/radixcache-cache.json                     the marker: {"format": "radixcache-kv-pages", "version": 1}
    DIR/pages/<tag>/fingerprint.json              {"fingerprint": "<the fingerprint string>"}
    DIR/pages/<tag>/<2 hex>/<hash hex>.kvpage     one page; <2 hex> is the hash's first byte
    DIR/tmp/<pid>-<16 hex>.tmp                    a file being written (renamed into place when complete)

`<tag>` is blake2b(fingerprint, digest_size=8) in hex: a directory shared by several models keeps each
fingerprint's pages apart, so that counting pages per fingerprint needs only the file names.

Invariants:

- Ownership: a directory is adopted only when it carries the marker, or holds nothing but temporary files of the
  store's naming (a marker write a kill cut short); then the marker is written first. Any other directory without
  the marker, or one with another format's, is never written to, read or cleaned; neither is one whose `pages/` or
  `tmp/` is a symlink or not a folder.
- Deletion: only regular files of the store's exact naming are deleted: `<pid>-<16 hex>.tmp` in `tmp/` (or, before
  the marker exists, in the directory itself) once its process is dead (under this process's own pid, a pid reused
  across a restart: once no write of this process is under way on it) or it is an hour old (`clear`: all of
  them), and `<hex>.kvpage` files in `pages/<16 hex>/<2 hex>/`. No symlink is followed: listings skip them, the
  cleanup enters `tmp/` through an O_NOFOLLOW descriptor, and reads open with O_NOFOLLOW.
- Every file this module writes goes to a temporary file first, is fsynced and `os.replace`d into place, and its
  folder is fsynced (radixcache.runtime.kv.tier.disk_files), so no reader sees a partial one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from radixcache.runtime.kv.tier.disk_files import (
    FULL_ERRNOS,
    is_real_dir,
    live_temp,
    own_temp_files,
    read_json,
    read_nofollow_with,
    temp_writer_pid,
    write_json_durable,
    writer_gone,
)
from radixcache.runtime.kv.tier.disk_format import (
    FORMAT_VERSION,
    PAGE_SUFFIX,
    CorruptPage,
    NewerPage,
    parse_page_stream,
)

log = logging.getLogger("radixcache.disk")

MARKER_NAME = "radixcache-cache.json"
MARKER_FORMAT = "radixcache-kv-pages"
FINGERPRINT_FILE = "fingerprint.json"
_STALE_TMP_SECONDS = 3600.0  # a temporary file this old is left over, whoever wrote it
_TAG = re.compile(r"[0-9a-f]{16}")  # a fingerprint folder's name (fingerprint_tag)
_HASH_FOLDER = re.compile(r"[0-9a-f]{2}")
_PAGE_NAME = re.compile(r"[0-9a-f]{2,128}" + re.escape(PAGE_SUFFIX))


def fingerprint_tag(fingerprint: str) -> str:
    """The directory name of a fingerprint's pages: blake2b(fingerprint, digest_size=8) in hex."""
    return hashlib.blake2b(fingerprint.encode("utf-8"), digest_size=8).hexdigest()


def cache_path(directory: str | os.PathLike[str]) -> str:
    """A cache directory's absolute path, a leading `~` expanded as a model's path is: "~/kv" is in the home folder,
    never a folder named "~" in the working directory (which moved with it, and which `rm -r ~` would clear). ValueError
    when `~` names no home folder (HOME unset and no passwd entry: a container's arbitrary uid), or for an empty path
    (an unset variable, `--cache-dir "$DIR"`), which abspath made the working directory: its pages written there, or a
    `cache clear` clearing it."""
    text = os.fspath(directory)
    if not text:
        raise ValueError("cache directory: the path is empty (an unset variable?); give a folder")
    path = os.path.expanduser(text)
    if path == "~" or path.startswith("~" + os.sep):
        raise ValueError(f"cache directory {text!r}: there is no home folder for '~' (HOME is unset); give a full path")
    return os.path.abspath(path)


def delete_temp_files(folder: str, *, only_leftovers: bool) -> None:
    """Delete the regular files of `folder` named as the store names its temporary files (all of them, or only
    those whose writer is dead or that are over an hour old). Never follows a symlink; never raises."""
    listed = own_temp_files(folder)
    if listed is None:
        return
    fd, files = listed
    now = time.time()
    try:
        for name, pid, mtime in files:
            if only_leftovers and not writer_gone(name, pid) and now - mtime < _STALE_TMP_SECONDS:
                continue
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.debug("cannot remove the temporary file %s: %s", os.path.join(folder, name), exc)
    finally:
        os.close(fd)


class Adoption(NamedTuple):
    """What opening a directory for writing found. refused: why the store may not write (None when it may).
    readable: whether its pages may still be listed and read (False for a directory that is not ours). full: refused
    for a full disk in a directory already marked ours (writing may be tried again once space is freed)."""

    refused: str | None
    readable: bool
    full: bool = False
    code: int | None = None  # the errno of a refusal an OSError caused (ENOSPC, EACCES, ...)


@dataclass(frozen=True)
class CacheDir:
    """The paths of one cache directory, seen by one fingerprint (`tag`), and the file operations on them."""

    directory: str
    tag: str

    @property
    def marker_path(self) -> str:
        return os.path.join(self.directory, MARKER_NAME)

    @property
    def pages_root(self) -> str:
        return os.path.join(self.directory, "pages")

    @property
    def pages_dir(self) -> str:
        """This fingerprint's pages."""
        return os.path.join(self.pages_root, self.tag)

    @property
    def tmp_dir(self) -> str:
        return os.path.join(self.directory, "tmp")

    def page_path(self, page_hash: bytes) -> str:
        hex_ = page_hash.hex()
        return os.path.join(self.pages_dir, hex_[:2], hex_ + PAGE_SUFFIX)

    # ------------------------------------------------------------------------------------------- ownership

    def check_marker(self, *, strict: bool) -> bool:
        """True when the marker is there and names this format. ValueError when it names another one (or, when
        `strict`, when it is missing)."""
        try:
            marker = read_json(self.marker_path)
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

    def check_own_folders(self) -> None:
        """ValueError unless `pages/` and `tmp/` are real folders (or absent): a symlink there is never followed."""
        for sub in (self.pages_root, self.tmp_dir):
            if os.path.lexists(sub) and not is_real_dir(sub):
                raise ValueError(f"{sub} is a symlink or not a folder: not following it")

    def adopt(self, fingerprint: str) -> Adoption:
        """Make the directory ready for this fingerprint's writes: create it, check or write the marker, record the
        fingerprint, clear leftovers, and probe that a file can be created. Never raises for I/O reasons.

        Without the marker, the directory is adopted only when it holds nothing but temporary files of the store's
        own naming (a marker write that a kill cut short): the marker is then written first, durably."""
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            return Adoption(f"cannot create {self.directory}: {exc}", readable=False, code=exc.errno)
        try:
            has_marker = self.check_marker(strict=False)
            self.check_own_folders()
        except ValueError as exc:
            return Adoption(str(exc), readable=False)  # another format's directory, or a symlink: touch nothing
        if not has_marker:
            try:
                others = [n for n in os.listdir(self.directory) if temp_writer_pid(n) is None]
            except OSError as exc:
                return Adoption(f"cannot list {self.directory}: {exc}", readable=False)
            if others:
                reason = f"{self.directory} is not empty and is not a radixcache cache (no {MARKER_NAME})"
                return Adoption(f"{reason}: not using it", readable=False)
        try:
            if not has_marker:
                delete_temp_files(self.directory, only_leftovers=True)
                marker = {"format": MARKER_FORMAT, "version": FORMAT_VERSION}
                write_json_durable(self.marker_path, marker, self.directory)
            self.ensure_page_dirs(fingerprint)
            self.remove_leftovers()
            with live_temp(self.tmp_dir) as probe:
                with open(probe, "xb"):
                    pass
                os.unlink(probe)
        except OSError as exc:  # still serves its pages
            full = exc.errno in FULL_ERRNOS and os.path.isfile(self.marker_path)  # a write makes the folders again
            return Adoption(f"cannot write to {self.directory}: {exc}", readable=True, full=full, code=exc.errno)
        return Adoption(None, readable=True)

    def remake(self, fingerprint: str) -> None:
        """Make again the folders a page write needs, after they vanished: this fingerprint's folders, and when the
        marker went too (an `rm -rf` of the whole directory while a server runs), the directory and its marker first,
        adopted as at open (`adopt`: never a directory that something else now fills). Raises OSError: the errno of
        the failure (ENOSPC: the store pauses and tries again), ENOTEMPTY for a directory that is not ours."""
        if not os.path.lexists(self.marker_path):
            adoption = self.adopt(fingerprint)
            if adoption.refused is not None:
                code = adoption.code if adoption.code is not None else errno.ENOTEMPTY
                raise OSError(code, f"the cache directory vanished and was not made again: {adoption.refused}")
        self.ensure_page_dirs(fingerprint)

    def ensure_page_dirs(self, fingerprint: str) -> None:
        """Create tmp/ and this fingerprint's folder, with its fingerprint.json, where missing. Raises OSError (ELOOP
        when one of them is a symlink)."""
        for folder in (self.tmp_dir, self.pages_root, self.pages_dir):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
            if not is_real_dir(folder):
                raise OSError(errno.ELOOP, "a symlink or not a folder", folder)
        name_file = os.path.join(self.pages_dir, FINGERPRINT_FILE)
        if not os.path.lexists(name_file):
            write_json_durable(name_file, {"fingerprint": fingerprint}, self.tmp_dir)

    def remove_leftovers(self) -> None:
        """Delete the temporary files a killed process left: files named as the store names them, whose writer is
        dead or that are over an hour old. Nothing else in tmp/ is touched; a symlinked tmp/ is not entered."""
        delete_temp_files(self.tmp_dir, only_leftovers=True)

    def remove_temp_files(self) -> None:
        """Delete every temporary file of the store's naming, whoever writes it (`clear`)."""
        delete_temp_files(self.tmp_dir, only_leftovers=False)

    # ------------------------------------------------------------------------------------------- listing

    def _tag_folders(self) -> list[os.DirEntry[str]]:
        if not is_real_dir(self.pages_root):
            return []
        try:
            return [
                e for e in os.scandir(self.pages_root) if _TAG.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
            ]
        except OSError:
            return []

    def _hash_folders(self, tag: os.DirEntry[str]) -> list[os.DirEntry[str]]:
        try:
            entries = os.scandir(tag.path)
            return [e for e in entries if _HASH_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        except OSError:
            return []

    def hash_folders(self) -> list[str]:
        """The <2 hex> folders under every fingerprint folder (real folders only)."""
        return [sub.path for tag in self._tag_folders() for sub in self._hash_folders(tag)]

    def page_files(self) -> list[tuple[str, str, str]]:
        """(tag, hash hex, path) of every page file on disk, from directory listings alone: regular files named
        `<hex>.kvpage` in `<2 hex>` folders of `<16 hex>` fingerprint folders, no symlink followed or listed."""
        found: list[tuple[str, str, str]] = []
        for tag in self._tag_folders():
            for sub in self._hash_folders(tag):
                try:
                    files = list(os.scandir(sub.path))
                except OSError:
                    continue
                found.extend(
                    (tag.name, f.name[: -len(PAGE_SUFFIX)], f.path)
                    for f in files
                    if _PAGE_NAME.fullmatch(f.name) and f.is_file(follow_symlinks=False)
                )
        return found

    def remove_page_files(self) -> int:
        """Delete every page file and temporary file, and the hash folders left empty; the page files deleted.
        OSError when one cannot be deleted (one deleted meanwhile is not counted)."""
        count = 0
        for _, _, path in self.page_files():
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            count += 1
        self.remove_temp_files()
        for folder in self.hash_folders():
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only empty ones go
        return count

    def checked_page_files(self) -> Iterator[tuple[str, str, str]]:
        """(hash hex, path, error) of every page file this radixcache can judge (page_file_error; "": sound), an
        unreadable one as an error; one of a newer format, or deleted meanwhile (an eviction), is skipped."""
        for tag, hash_hex, path in self.page_files():
            try:
                error = page_file_error(tag, hash_hex, path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                error = f"unreadable ({exc})"
            if error is not None:
                yield hash_hex, path, error

    def fingerprint_of(self, tag: str) -> str:
        """The fingerprint string a tag's fingerprint.json records ("?<tag>" when unreadable or not the tag's)."""
        try:
            name = read_json(os.path.join(self.pages_root, tag, FINGERPRINT_FILE))["fingerprint"]
            if not isinstance(name, str) or fingerprint_tag(name) != tag:
                raise ValueError(name)
        except (OSError, ValueError, KeyError, TypeError):
            name = f"?{tag}"
        return name


def warn_if_foreign(directory: str, fingerprint: str, tags: set[str], names: dict[str, str]) -> None:
    """Warn of a directory whose pages (`tags`, by their fingerprint `names`) are all other models': a user expecting
    disk hits gets none, and saw nothing say why. At a store's open."""
    own = fingerprint_tag(fingerprint)
    if tags and own not in tags:
        others = sorted(names.get(tag, f"?{tag}") for tag in tags)
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        log.warning(
            "disk KV cache %s holds pages of %d other model fingerprint(s) (%s) and none of this model's (%s): "
            "no disk hits until this model writes its own",
            directory,
            len(others),
            shown,
            fingerprint,
        )


def in_own_folder(hash_hex: str, path: str) -> bool:
    """Whether a page file sits in the folder its name's first byte says (`<2 hex>/<hash hex>.kvpage`)."""
    return os.path.basename(os.path.dirname(path)) == hash_hex[:2]


def page_file_error(tag: str, hash_hex: str, path: str) -> str | None:
    """Why the page file at `path` (under fingerprint folder `tag`) is not sound, "" when it is, None when it is of a
    newer format (not this radixcache's to judge): the format's checks (read a piece at a time: a huge file takes no
    more memory than a page), that the recorded hash is its name (in its first byte's folder), that its fingerprint
    is its folder's, and that the name is hex. Raises OSError when it cannot be read."""
    try:
        recorded, fingerprint = read_nofollow_with(path, parse_page_stream)
        if recorded != hash_hex or not in_own_folder(hash_hex, path):
            raise CorruptPage(f"the file records hash {recorded:.64}, its name says {hash_hex:.64}")
        if fingerprint_tag(fingerprint) != tag:
            raise CorruptPage("the file's fingerprint is not its folder's")
        bytes.fromhex(hash_hex)
    except NewerPage:
        return None
    except (CorruptPage, ValueError) as exc:
        return str(exc)
    return ""
