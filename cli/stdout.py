"""'-' as an output file: stdout (`replay --json -`, `trace gen KIND -`, `trace convert SRC -`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator

import click

from radixcache.runtime.atomic_file import scratch

STDOUT = "-"


def is_stdout(path: str) -> bool:
    """Whether the output `path` is stdout: '-', or the file stdout is (/dev/stdout, or the file it is redirected to).
    What else the command prints then goes to stderr: both on stdout, `replay --json /dev/stdout | jq` read the JSON
    and then the table ('Extra data'), and `--json -` wrote a file named '-'."""
    if path == STDOUT:
        return True
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (AttributeError, OSError, ValueError):  # no such file yet, or a stdout with no descriptor (a test's)
        return False


@contextlib.contextmanager
def through_stdout() -> Iterator[str]:
    """A temporary file for a writer that takes a path, copied to stdout once the block succeeds and removed either
    way: a write that fails (a refused record, Ctrl-C) prints nothing, never a shorter trace that reads as sound.
    The file (radixcache.runtime.atomic_file.scratch: `$TMPDIR/radixcache-<pid>-<random>.partial`, private) of a
    run killed meanwhile is removed by the next run that writes to stdout."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # `>&-`: an AttributeError from the copy, after the whole write
        raise click.ClickException("stdout is closed: give a file name instead of '-'")
    handle, staging = scratch("radixcache-")  # the handle holds its lock: no other run takes it for a killed one's
    try:
        yield staging
        with open(staging, "rb") as source:
            try:
                shutil.copyfileobj(source, out)
                out.flush()
            except BrokenPipeError:
                raise  # `| head`: the reader left (cli.errors)
            except OSError as exc:  # a full disk under `> file` named no file ('[Errno 28] No space left on device')
                if exc.filename is not None or exc.strerror is None:
                    raise
                raise OSError(exc.errno, exc.strerror, "stdout") from None
    finally:
        with contextlib.suppress(OSError):
            os.remove(staging)
        os.close(handle)
