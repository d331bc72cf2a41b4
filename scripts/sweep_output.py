"""The output folder of the sweeps (scripts/simulate_eviction.py, scripts/simulate_routing.py), checked before the
first cell runs: a `--out` that could not be made or written, or a plot without matplotlib (a dev extra), was a
traceback once every cell had run (an hour of a sweep, say), with none of its results written."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import click


def prepare_out(out: str, plot: bool) -> Path:
    """The folder `out`, made (with its parents) and shown writable. A usage error when the plot is asked for and
    matplotlib is not installed; a ClickException naming --out when the folder cannot be made or written."""
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError(
            "the plot needs matplotlib, which is not installed: pip install matplotlib, or --no-plot"
        )
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a folder or file system this user cannot write refuses it
            pass
    except OSError as exc:
        raise click.ClickException(f"--out {out}: {exc.strerror or exc}") from None
    return folder
