"""`radixcache replay` stopped by a signal other than Ctrl-C: SIGTERM keeps what finished, as Ctrl-C does."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from radixcache.cli.main import main


def test_sigterm_prints_and_saves_what_finished_as_ctrl_c_does(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path, monkeypatch
) -> None:
    """SIGTERM (`timeout`, a batch scheduler's time limit) ended the replay at once: the table and the JSON of what
    had finished were lost. It stops the replay as Ctrl-C does (exit 130), and the handler before it is put back."""
    from radixcache.runtime.engine.engine import Engine

    class Unhandled(Exception):
        pass

    def unhandled(signum, frame):  # stands in for Python's default, which would end the test run
        raise Unhandled

    real, calls = Engine.generate, []

    def generate(self, prompt, *args, **kwargs):
        if kwargs.get("namespace") is None:
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        return real(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        out = tmp_path / "t.json"
        result = runner.invoke(main, ["replay", str(small_trace), "--model", str(tiny_model_dir), "--json", str(out)])
        assert signal.getsignal(signal.SIGTERM) is unhandled
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 130, result.output
    assert "cache (interrupted)" in result.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["interrupted"] is True and len(data["requests"]) == 2
