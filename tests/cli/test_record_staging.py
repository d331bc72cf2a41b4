"""`--record-trace FILE` keeps an earlier FILE until the first line is recorded, on `serve` as on `replay`
(cli.record.StagedRecording)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from radixcache.cli import serve as serve_module
from radixcache.cli.main import main

EARLIER = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'


def _serving(monkeypatch: pytest.MonkeyPatch, requests: int, seen: dict[str, Any]) -> None:
    """Replace uvicorn's server by one that, in place of clients, sends `requests` requests to the app's engine and
    notes what FILE held before the first and after the last."""

    class Server:
        def __init__(self, config: Any, *_: object) -> None:
            self.engine = config.app.state.engine

        def run(self, sockets: Any = None) -> None:
            seen["before"] = seen["path"].read_text()
            for i in range(requests):
                self.engine.generate(f"hello {i}", 2)
            seen["after"] = seen["path"].read_text()

    monkeypatch.setattr(serve_module, "_aborting_server", Server)


@pytest.mark.parametrize("requests", [0, 2])
def test_serve_keeps_an_earlier_recording_until_its_first_line(
    runner, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requests: int
) -> None:
    """`serve --record-trace FILE` opened FILE for writing at start: an earlier recording there was emptied before
    any request came, and lost for good by a server that served none (a wrong flag, a client that never came). FILE
    is now replaced at the first line; a server that served nothing leaves it as it was, and says so."""
    path = tmp_path / "served.jsonl"
    path.write_text(EARLIER)
    seen: dict[str, Any] = {"path": path}
    _serving(monkeypatch, requests, seen)
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--record-trace", str(path)]
    result = runner.invoke(main, [*args, "--page-size", "4"])
    assert result.exit_code == 0, result.output
    assert seen["before"] == EARLIER  # the server was up, and no request had come
    if requests:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == requests and seen["after"] == path.read_text()  # each line as its request left
        assert f"recorded {path}: {requests} requests" in result.stderr
    else:
        assert path.read_text() == EARLIER
        assert f"recorded nothing (no request was served): {path} left as it was" in result.stderr
        assert "radixcache simulate" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served.jsonl"]  # no staging file left beside it
