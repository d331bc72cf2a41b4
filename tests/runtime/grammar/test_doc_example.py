"""The Python example of docs/structured_output.md runs as shown (with the tiny checkpoint in place of SmolLM2) and
prints a JSON object that validates against the example's schema."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import jsonschema

from tests.cli.conftest import write_tiny_checkpoint

DOC = Path(__file__).resolve().parents[3] / "docs" / "structured_output.md"


def test_the_documented_example_runs(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    tiny = write_tiny_checkpoint(tmp_path / "tiny")
    namespace: dict[str, object] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace('"smollm2"', repr(str(tiny))), str(DOC), "exec"), namespace)
    value = eval(printed.getvalue())  # the example prints a dict
    jsonschema.validate(json.loads(json.dumps(value)), namespace["schema"])
