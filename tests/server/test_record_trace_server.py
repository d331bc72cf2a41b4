"""`radixcache serve --record-trace`: every request becomes a line as it is served (before any shutdown), with the
`user` field or the X-Session-Id header as its session, hash ids only (no text), and SIGTERM closes the file and
prints the `radixcache simulate` command that replays it."""

from __future__ import annotations

import json
import re
import shlex
import signal
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from radixcache.cli.main import main

ALLOWED = {
    "timestamp",
    "input_length",
    "output_length",
    "hash_ids",
    "block_size",
    "output_hash_ids",
    "session_id",
    "finish_timestamp",
}
SECRET = "pineapple-zebra-47"


def _chat(server, messages: list[dict], **extra: object) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": 4, **extra}
    response = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
def test_serve_records_each_request_with_its_session_and_never_its_text(launch, tiny_model_dir, tmp_path: Path) -> None:
    path = tmp_path / "served.jsonl"
    args = ("--page-size", "4", "--capacity-blocks", "256", "--record-trace", str(path))
    with launch(tiny_model_dir, *args) as server:
        turn1 = [{"role": "user", "content": f"My password is {SECRET}, remember it."}]
        reply = _chat(server, turn1, user="alice")["choices"][0]["message"]["content"]
        turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "What was it?"}]
        _chat(server, turn2, user="alice")
        body = {"model": "tiny", "prompt": f"Tell me about {SECRET}.", "max_tokens": 3}
        completion = httpx.post(server.v1 + "/completions", json=body, headers={"X-Session-Id": "bob-7"}, timeout=60)
        assert completion.status_code == 200, completion.text
        served = path.read_text()  # written as each request left, before any shutdown
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        log = server.proc.stdout.read()  # type: ignore[union-attr]
    assert f"recorded {path}: 3 requests, hit rate " in log
    # The printed command replays the recording through the tree alone; these requests ran one at a time, so it
    # gives the hit rate the server reported.
    served_rate = re.search(r"hit rate ([0-9.]+)% as served", log).group(1)  # type: ignore[union-attr]
    command = re.search(r"through the tree alone: radixcache (simulate .*)", log).group(1)  # type: ignore[union-attr]
    assert float(served_rate) > 0 and "--capacity-blocks 256 --policy lru --block-size 4" in command
    result = CliRunner().invoke(main, [*shlex.split(command), "--json"])
    assert result.exit_code == 0, result.output
    assert f"{json.loads(result.stdout)['hit_rate']:.2%}" == f"{served_rate}%"
    assert path.read_text() == served and served.endswith("\n")
    rows = [json.loads(line) for line in served.splitlines()]
    assert [r["session_id"] for r in rows] == ["alice", "alice", "bob-7"]
    assert SECRET not in served and "password" not in served
    for row in rows:
        assert set(row) <= ALLOWED and row["block_size"] == 4
        assert len(row["hash_ids"]) == -(-row["input_length"] // 4)
        assert all(isinstance(i, int) and 0 <= i < 2**63 for i in row["hash_ids"] + row["output_hash_ids"])
    first, second, third = rows
    whole = first["input_length"] // 4
    assert second["hash_ids"][:whole] == first["hash_ids"][:whole]  # turn 2 holds turn 1's prompt
    assert second["input_length"] > first["input_length"]
    assert third["hash_ids"][0] != first["hash_ids"][0]  # a raw completion does not start with the chat template
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
