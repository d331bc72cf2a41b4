"""A trace given as `-` (stdin) or as a pipe (/dev/stdin, `<(zcat t.jsonl.gz)`): copied once into a temporary
file, which the commands then read as they read any trace (the simulator reads it more than once, detection reads
its head), with `<stdin>` (or the pipe's own path) in place of the copy's path in their output and errors."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

import click

from radixcache.trace import TraceError

STDIN_NAME = "<stdin>"
_CHUNK = 1 << 20  # copied a MiB at a time: a pipe of any size (or a line of 1 GB) never sits whole in memory


def is_piped(path: str) -> bool:
    """Whether the trace argument `path` is stdin (`-`) or an existing path that is no regular file (a pipe)."""
    return path == "-" or (os.path.exists(path) and not os.path.isfile(path))


def shown_name(path: str) -> str:
    """How output and errors name the trace argument `path`: `<stdin>` for `-` and /dev/stdin, else `path`."""
    return STDIN_NAME if path in ("-", "/dev/stdin") else path


@contextlib.contextmanager
def readable_trace(path: str) -> Iterator[str]:
    """The file to read for the trace argument `path`: `path` itself when it is a regular file (or missing: the
    readers word that), else a temporary copy of the pipe, removed when the block ends. The block's click errors
    and TraceErrors name `shown_name(path)`, not the copy. The copy's suffix is `path`'s (a .msgpack pipe stays
    msgpack to detection)."""
    if not is_piped(path):
        yield path
        return
    name = shown_name(path)
    with tempfile.TemporaryDirectory(prefix="radixcache-trace-") as folder:
        copy = os.path.join(folder, "trace" + ("" if path == "-" else os.path.splitext(path)[1]))
        try:
            with _opened(path) as source, open(copy, "wb") as target:
                shutil.copyfileobj(source, target, _CHUNK)
        except OSError as exc:
            raise click.ClickException(f"{name}: {exc.strerror or exc}") from None
        try:
            yield copy
        except TraceError as exc:
            if exc.path != copy:
                raise
            raise TraceError(name, exc.where, exc.message, exc.field) from None
        except click.ClickException as exc:  # a reader's error, worded by the command (or from a worker process)
            exc.message = exc.message.replace(copy, name)
            raise


@contextlib.contextmanager
def _opened(path: str) -> Iterator[BinaryIO]:
    if path == "-":
        yield sys.stdin.buffer
        return
    with open(path, "rb") as handle:
        yield handle
