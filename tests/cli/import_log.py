"""What a script imported, read from the `-X importtime` log Python writes to stderr: the argument-refusal tests
run a script with it to check that a bad argument was refused before torch (seconds to import) loaded."""

from __future__ import annotations

import sys

IMPORTTIME = [sys.executable, "-X", "importtime"]


def imported(stderr: str) -> set[str]:
    """The modules `-X importtime` logged in `stderr` (full dotted names)."""
    lines = [line for line in stderr.splitlines() if line.startswith("import time:") and "|" in line]
    return {line.rsplit("|", 1)[-1].strip() for line in lines}
