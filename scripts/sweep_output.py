"""The output folder of the sweeps (scripts/simulate_eviction.py, scripts/simulate_routing.py), checked before the
first cell runs: a `--out` that could not be made or written, or a plot without matplotlib (a dev extra), was a
traceback once every cell had run (an hour of a sweep, say), with none of its results written."""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from pathlib import Path

import click


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
