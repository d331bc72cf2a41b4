"""`radixcache chat` on a terminal: a reply's control characters are shown as escapes, never sent to the terminal
(a model, or a tool result it echoes, could write the clipboard with OSC 52, retitle the window, move the cursor);
`replay -v` likewise for a trace's conversation ids."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from radixcache.cli import chat as chat_cli
from radixcache.cli.main import main
from radixcache.cli.terminal import terminal_text

HOSTILE = "ok\x1b]52;c;ZXZpbA==\x07 \x1b[2J\rtab\there\nnext line \u009b31m naïve 日本 🙂"


def test_terminal_text_escapes_controls_but_keeps_newline_tab_and_unicode() -> None:
    shown = terminal_text(HOSTILE)
    expected = "".join(  # an independent rule: every Cc character but \n and \t is escaped as repr writes it
        ch if ch in "\n\t" or not (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0) else repr(ch)[1:-1] for ch in HOSTILE
    )
    assert shown == expected
    assert not any((ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) < 0xA0 for ch in shown)
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown and "\\r" in shown and "\\x9b" in shown
    assert "naïve 日本 🙂" in shown and "tab\there\nnext" in shown


@pytest.mark.parametrize("terminal", [True, False])
def test_chat_escapes_a_reply_only_on_a_terminal(runner, tiny_model_dir: Path, monkeypatch, terminal: bool) -> None:
    from radixcache.runtime.engine.session import Session

    real_send = Session.send

    def send(self, content, **kwargs):
        return dataclasses.replace(real_send(self, content, **kwargs), text=HOSTILE)

    monkeypatch.setattr(Session, "send", send)
    monkeypatch.setattr(chat_cli, "_to_terminal", lambda: terminal)
    result = runner.invoke(main, ["chat", "--model", str(tiny_model_dir), "--max-tokens", "2"], input="hi\n")
    assert result.exit_code == 0, result.output
    if terminal:
        assert "\x1b]" not in result.stdout and "\x07" not in result.stdout and "\r" not in result.stdout
        assert terminal_text(HOSTILE) in result.stdout
    else:  # a pipe or a file: the reply as generated, its CSI codes too (click.echo drops them from a pipe's text)
        assert "model> " + HOSTILE + "\n" in result.stdout


def test_replay_verbose_lines_escape_a_traces_conversation_ids(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [{"id": "c\x1b]52;c;ZXZpbA==\x07\u009b2J", "turns": [{"user": "hi"}, {"user": "x" * 5000}]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["replay", str(trace), "--model", str(tiny_model_dir), "--max-tokens", "2", "-v"]
    result = runner.invoke(main, args)
    assert "turn 1: 0/" in result.stderr and "skipped" in result.stderr, result.output  # a line and a warning
    assert "c\\x1b]52;c;ZXZpbA==\\x07\\x9b2J turn 1" in result.stderr
    assert not any((ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) < 0xA0 for ch in result.stderr)
