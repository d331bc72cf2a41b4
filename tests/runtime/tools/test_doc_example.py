"""The Python example of docs/tool_calls.md runs as shown (with the tiny checkpoint in place of SmolLM2): it prints
the finish reason and the parsed call, and asserts that the next prompt extends the first prompt and output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "tool_calls.md"


def test_the_documented_example_runs(tiny_dir: Path) -> None:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace('"smollm2"', repr(str(tiny_dir))), str(DOC), "exec"), {})
    assert printed.getvalue() == "tool_calls {'name': 'get_weather', 'arguments': '{\"city\": \"Paris\"}'}\n"
