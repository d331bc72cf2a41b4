"""The output of the sweeps (scripts/simulate_eviction.py, scripts/simulate_routing.py): the folder, checked before the
first cell runs (a `--out` that could not be made or written, or a plot without matplotlib, a dev extra, was a
traceback once every cell had run, an hour of a sweep say, with none of its results written), and its files, each
written whole."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click

from radixcache.runtime import atomic_file


def check_out(out: str, plot: bool) -> Path:
    """The folder `out`, shown to be one this process can make and write in, and left as it was (a sweep that
    fails in a cell writes nothing). A usage error when the plot is asked for and matplotlib is not installed; a
    ClickException naming --out when the folder cannot be made or written."""
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError(
            "the plot needs matplotlib, which is not installed: pip install matplotlib (or --no-plot)"
        )
    folder = Path(out)
    missing = [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a folder or file system this user cannot write refuses it
            pass
    except OSError as exc:
        raise click.ClickException(f"--out {out}: {exc.strerror or exc}") from None
    finally:
        for made in missing:  # the deepest first
            with contextlib.suppress(OSError):
                made.rmdir()
    return folder


def make_out(folder: Path) -> Path:
    """`folder` made, with its parents, once the cells have run (check_out showed it can be)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"--out {folder}: {exc.strerror or exc}") from None
    return folder


def write_whole(path: Path, data: str | bytes) -> None:
    """`data` as the whole file at `path`, through a staging file moved onto it (radixcache.runtime.atomic_file): a
    write cut short (a full disk, Ctrl-C) leaves the earlier file whole, where it left a shorter one that reads as a
    sound result. A ClickException naming `path` on an OSError."""
    try:
        atomic_file.write_bytes(path, data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc.strerror or exc}") from None


def csv_text(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """The CSV of `header` and `rows`, as csv.writer writes it to a file opened with newline=""."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def save_figure(fig: Any, path: Path, dpi: int) -> None:
    """matplotlib's `fig.savefig(path, dpi=dpi)`, written whole as `write_whole` writes (the format from `path`'s
    suffix, which the staging file's name does not keep)."""
    try:
        with atomic_file.staged(path) as staging:
            fig.savefig(staging, dpi=dpi, format=path.suffix.lstrip(".") or None)
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc.strerror or exc}") from None
