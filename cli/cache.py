"""`radixcache cache`: inspect and maintain a disk KV cache directory (the runtime's disk tier).

Loads no model and never imports torch: the store (radixcache.runtime.kv.tier.disk_store) is plain files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from radixcache.cli.errors import FriendlyCommand, FriendlyGroup, debug_option

if TYPE_CHECKING:
    from radixcache.runtime.kv.tier.disk_store import DiskStore


class _CacheDir(click.Path):
    """A cache directory, a leading `~` expanded as the engine expands `--cache-dir` (kv.tier.disk_layout.cache_path):
    a quoted '~/kv' (or one given by a script, which no shell expands) is the engine's directory, not a missing one."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        from radixcache.runtime.kv.tier.disk_layout import cache_path  # no torch

        if isinstance(value, str):
            try:
                value = cache_path(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)


_DIR = click.argument("directory", metavar="DIR", type=_CacheDir(exists=True, file_okay=False))


def _open(directory: str) -> DiskStore:
    """An inspecting handle: ValueError (one line: error, exit 1) unless DIR is a radixcache cache."""
    from radixcache.runtime.kv.tier.disk_store import DiskStore  # by the cache commands only (no torch)

    return DiskStore(directory, max_bytes=0, create=False)


@contextlib.contextmanager
def _store_log_quiet() -> Iterator[None]:
    """Silence the store's warnings (which would reach stderr through logging's last-resort handler)."""
    logger = logging.getLogger("radixcache.disk")
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@click.group(cls=FriendlyGroup)
def cache() -> None:
    """Inspect and maintain a disk KV cache directory.

    \b
    Example:
      radixcache cache stats kv-cache
      radixcache cache verify kv-cache
      radixcache cache clear kv-cache --yes
    """


@cache.command(cls=FriendlyCommand)
@_DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@debug_option
def stats(directory: str, as_json: bool, debug: bool) -> None:
    """Pages and bytes of DIR, per model fingerprint.

    From file names and sizes alone: fast on any size of cache.

    \b
    Example:
      radixcache cache stats kv-cache --json
    """
    s = _open(directory).stats()
    if as_json:
        out = {
            "directory": s.directory,
            "pages": s.pages,
            "bytes": s.bytes,
            "fingerprints": {
                name: {"pages": pages, "bytes": s.fingerprint_bytes.get(name, 0)}
                for name, pages in s.fingerprints.items()
            },
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    click.echo(f"{s.directory}: {s.pages:,} pages, {_size(s.bytes)} ({s.bytes:,} bytes)")
    if not s.pages:
        return
    table = Table()
    table.add_column("fingerprint")
    table.add_column("pages", justify="right")
    table.add_column("bytes", justify="right")
    for name, pages in s.fingerprints.items():
        # Text, not markup: a model's name (its file's) may hold brackets, which rich would take as style tags
        table.add_row(Text(name or "(empty)"), f"{pages:,}", _size(s.fingerprint_bytes.get(name, 0)))
    Console().print(table)


@cache.command(cls=FriendlyCommand)
@_DIR
@click.option("--keep", is_flag=True, help="Only report corrupt pages; do not delete them.")
@debug_option
def verify(directory: str, keep: bool, debug: bool) -> None:
    """Check every page of DIR; delete the corrupt ones.

    Reads each page file whole and checks its magic, checksum, header, length, and that the hash it records is its
    file name. Corrupt pages are deleted unless --keep. Exit status 1 when a page was corrupt, 0 when all were sound.

    \b
    Example:
      radixcache cache verify kv-cache --keep
    """
    store = _open(directory)
    with _store_log_quiet():  # each corrupt page is printed below, with its reason
        report = store.verify(delete=not keep)
    for path, reason in zip(report.corrupt, report.reasons, strict=True):
        click.echo(f"corrupt: {path}: {reason}")
    line = f"checked {report.checked:,} pages: {report.ok:,} ok, {len(report.corrupt):,} corrupt"
    if report.corrupt:
        line += f", {report.removed:,} removed" if not keep else " (kept: --keep)"
    click.echo(line)
    if report.corrupt:
        raise click.exceptions.Exit(1)


@cache.command(cls=FriendlyCommand)
@_DIR
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@debug_option
def clear(directory: str, yes: bool, debug: bool) -> None:
    """Delete every page of DIR.

    DIR must be a radixcache cache (it has radixcache-cache.json): any other directory is refused. Asks first
    unless --yes.

    \b
    Example:
      radixcache cache clear kv-cache --yes
    """
    try:
        store = _open(directory)
    except ValueError as exc:
        raise ValueError(f"refusing to clear: {exc}") from None
    pages = store.stats().pages
    if not yes:
        click.confirm(f"Delete {pages:,} pages from {store.directory}?", abort=True)
    removed = store.clear()
    click.echo(f"removed {removed:,} pages from {store.directory}")
