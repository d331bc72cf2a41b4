"""`radixcache serve --replicas 2` as a real process on a local Ray cluster, through the `openai` client: a
conversation's later turns report cached tokens (they are routed to the replica that holds their history), streams
work, and /metrics sums the replicas; and `radixcache replay --replicas 2`. Both on the tiny checkpoint (a byte-level
tokenizer and a ChatML template): they check routing, caching and streaming over Ray, not the model's text, and two
replicas decoding SmolLM2 on a busy 2-core machine took about 15 s more of the test run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time
REPO = Path(__file__).resolve().parents[1]


def _server_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("_server_conftest", REPO / "server" / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _conversation(client: Any, model: str, turns: list[str], system: str) -> list[int]:
    """Cached tokens of each turn of one conversation (the history grows with the model's replies)."""
    history = [{"role": "system", "content": system}]
    cached = []
    for text in turns:
        history.append({"role": "user", "content": text})
        reply = client.chat.completions.create(model=model, messages=history, max_tokens=6, temperature=0)
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    return cached


def test_two_replicas_serve_conversations_that_hit_their_history(local_ray: str, tiny_dir: Path) -> None:
    """The server joins the shared Ray cluster (--ray-address; conftest.py): its replicas are Ray actors there."""
    import openai

    args = ("--replicas", "2", "--router", "cache_aware", "--kv-memory", "64MiB", "--ray-address", local_ray)
    with _server_conftest().start_server(tiny_dir, *args, served="tiny") as server:
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)
        for i in range(3):
            system = f"You are tutor number {i}, for geography. Answer in a few words, always politely. " * 2
            turns = ["What is the capital of France?", "And of Italy?", "And of Spain?"]
            cached = _conversation(client, "tiny", turns, system)
            assert cached[0] == 0 or i > 0
            assert all(c >= 32 for c in cached[1:]), cached  # each later turn found its history on its replica
        chunks = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Say hello."}], max_tokens=5, stream=True
        )
        parts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        assert len(parts) >= 2
        metrics = server.metrics()
        assert metrics["radixcache_engine_requests_total"] >= 10
        assert metrics["radixcache_prefix_cache_hits_tokens_total"] > 0


def test_replay_on_replicas_prints_each_replicas_share(tmp_path: Path, tiny_dir: Path) -> None:
    """Without --ray-address: the CLI starts a local Ray cluster of its own (and shuts it down)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "from radixcache.cli.main import run; run()", "replay", "--model", str(tiny_dir)]
    cmd += ["--replicas", "2", "--limit", "4", "--max-tokens", "3", "--capacity-blocks", "2048", "--page-size", "4"]
    cmd += ["--concurrency", "2", "--json", str(tmp_path / "r.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Started a local Ray instance" in done.stderr  # its own, not the shared cluster (conftest.py)
    assert "cache_aware over 2 replicas" in done.stdout and "indexed pages" in done.stdout
    import json

    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["requests"] == 14 and summary["hit_rate"] > 0.5
    refused = subprocess.run([*cmd, "--compare"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and "--replicas" in refused.stderr
