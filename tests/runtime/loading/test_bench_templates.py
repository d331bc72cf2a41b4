"""scripts/bench_templates.py: each template's chat renders the same in Jinja and in the sandbox (the script checks
it before timing), and its options are checked as argparse reads them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_templates.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_templates", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_templates"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_template_renders_alike_and_is_timed(capsys) -> None:
    rows = _bench().main(["--lengths", "4,12", "--rounds", "2", "--repeats", "1"])
    assert [(r["template"], r["messages"]) for r in rows][:2] == [("chatml", 4), ("chatml", 12)]
    assert {r["template"] for r in rows} == {"chatml", "llama3", "gemma", "qwen2.5+tools", "mistral"}
    assert all(r["jinja_ms"] > 0 and r["sandbox_ms"] > 0 for r in rows)
    assert "| gemma | 11 |" in capsys.readouterr().out  # 12 would end on the assistant's turn


def test_the_qwen_chat_has_tool_calls_and_results() -> None:
    chat = _bench().chat(12, system=True, tools=True)
    exchange = ["user", "assistant"]
    assert [m["role"] for m in chat] == [
        "system",
        *exchange * 2,
        "user",
        "assistant",
        "tool",
        "assistant",
        *exchange,
        "user",
    ]
    assert chat[6]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "expected an int >= 1"),
        (["--lengths", "3,x"], "--lengths: expected an int >= 2"),
        (["--templates", "chatml,nope"], "unknown 'nope'"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _bench().main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
