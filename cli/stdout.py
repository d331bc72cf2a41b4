"""'-' as an output file: stdout (`replay --json -`, `trace gen KIND -`, `trace convert SRC -`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

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
    way: a write that fails (a refused record, Ctrl-C) prints nothing, never a shorter trace that reads as sound."""
    handle, staging = tempfile.mkstemp(prefix="radixcache-", suffix=".partial")
    os.close(handle)
    try:
        yield staging
        out = sys.stdout.buffer
        with open(staging, "rb") as source:
            shutil.copyfileobj(source, out)
        out.flush()
    finally:
        with contextlib.suppress(OSError):
            os.remove(staging)
