"""`--record-trace FILE` on `replay` and `serve`: the option, its check before the model loads, and the
`radixcache simulate` command that reproduces a recorded replay (docs/traces.md, "Recording your own traffic")."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import click

RECORD_HELP = (
    "Write what the engine served to FILE as a Mooncake-format hash trace (one JSONL line per request: arrival, "
    "lengths, chained page hashes, session; never text or token ids), for `radixcache simulate`."
)

CONCURRENT_NOTE = (
    "(approximate with --concurrency > 1: the simulator shares a request's new pages when it finishes, the engine "
    "as soon as they are computed)"
)

SERVED_NOTE = (
    "(approximate for a server: it ran its clients' requests side by side, the simulator runs them one at a time; "
    "add --concurrency N for N in flight)"
)


def record_option(func: Callable) -> Callable:
    """--record-trace FILE."""
    return click.option(
        "--record-trace", metavar="FILE", type=click.Path(dir_okay=False, writable=True), help=RECORD_HELP
    )(func)


def check_record_path(path: str | None) -> None:
    """Refuse, before the model loads, a FILE whose folder does not exist or cannot be written."""
    if path is None:
        return
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise click.BadParameter(f"the folder {str(folder)!r} does not exist", param_hint="'--record-trace'")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"the folder {str(folder)!r} is not writable", param_hint="'--record-trace'")


class EngineShape(NamedTuple):
    """What `simulate_command` needs of an engine that is not a replay's summary (a server's)."""

    capacity_blocks: int
    policy: str
    page_size: int
    concurrency: int = 1


def simulate_command(path: str, summary: Any, admission: str | None = None) -> str:
    """The `radixcache simulate` command that replays a recorded run through the tree alone: the engine's pool size,
    policy, page size and concurrency (`summary`: a replay's, or anything with those four attributes), and its
    admission policy unless it adopted every page. (A recorded request holds, while it runs in the simulator, one
    block for the partial page the engine was writing.)"""
    args = ["radixcache", "simulate", shlex.quote(path), "--capacity-blocks", str(summary.capacity_blocks)]
    args += ["--policy", summary.policy, "--block-size", str(summary.page_size)]
    if summary.concurrency > 1:
        args += ["--concurrency", str(summary.concurrency)]
    if admission not in (None, "all"):
        args += ["--admission", str(admission)]
    return " ".join(args)
