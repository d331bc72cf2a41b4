"""Leases over HTTP, against `radixcache serve` as a real subprocess on the tiny checkpoint: `retain_for` as an
OpenAI `extra_body` field and as a per-key default (`--retain-for`), `usage.lease` in whole and streamed responses
read by the openai client, hostile values as 400s naming the field, and a client killed with SIGKILL mid-lease
(a real subprocess, by pid) leaving nothing locked once its lease's deadline has passed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import REPO, _cli_conftest, start_server

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("lease_servers")]
PROMPT = "An agent's context: the system prompt, the tools, the task so far. " * 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cli_conftest().write_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def keyed(model_dir: Path):
    args = ("--api-key", "sk-alice", "--api-key", "sk-bob", "--capacity-blocks", "256")
    with start_server(model_dir, *args, "--retain-for", "sk-alice=30", "--retain-for", "4") as s:
        yield s


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=60)


def _health(server, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(server.url + "/health/cache", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("raw", ["-1", "NaN", "Infinity", "true", '"30"', "1e12", "[5]", "{}"])
def test_a_hostile_retain_for_is_a_400_naming_it(keyed, raw: str) -> None:
    body = '{"model": "tiny", "prompt": "hi", "max_tokens": 1, "retain_for": ' + raw + "}"
    headers = {"Authorization": "Bearer sk-bob", "content-type": "application/json"}
    r = httpx.post(keyed.v1 + "/completions", content=body.encode(), headers=headers, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "retain_for"


def test_the_body_then_the_key_then_every_key_s_default(keyed) -> None:
    def lease(key: str, **extra) -> dict | None:
        r = _client(keyed, key).completions.create(model="tiny", prompt=PROMPT, max_tokens=3, extra_body=extra)
        return (r.usage.model_extra or {}).get("lease")

    alice = lease("sk-alice")
    assert alice["seconds"] == 30.0 and alice["tokens"] > 0  # its key's default
    assert lease("sk-bob")["seconds"] == 4.0  # the "*" default
    assert lease("sk-bob", retain_for=2.5)["seconds"] == 2.5  # the body's own
    assert lease("sk-bob", retain_for=0) == {"seconds": 0.0, "tokens": 0}
    assert _health(keyed, "sk-bob")["leases"] >= 1


def test_a_stream_s_usage_says_what_was_granted(keyed) -> None:
    chunks = _client(keyed, "sk-bob").chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"retain_for": 7},
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].model_extra["lease"]["seconds"] == 7.0
    assert usage[0].model_extra["lease"]["tokens"] > 0


CLIENT = """
import sys, time, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=60)
r = c.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=4, extra_body={"retain_for": 3})
print("leased", r.usage.model_extra["lease"]["tokens"], flush=True)
stream = c.completions.create(model="tiny", prompt=sys.argv[2] + " more", max_tokens=400, stream=True)
for chunk in stream:
    print("chunk", flush=True)
    time.sleep(0.05)
"""


def test_a_client_killed_mid_lease_leaves_nothing_locked_after_the_deadline(model_dir: Path) -> None:
    with start_server(model_dir, "--capacity-blocks", "256") as server:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, server.v1, PROMPT], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            first = proc.stdout.readline().split()  # type: ignore[union-attr]
            assert first[0] == "leased" and int(first[1]) > 0
            t_leased = time.monotonic()
            line = proc.stdout.readline()  # type: ignore[union-attr]  # its second request is streaming now
            assert line.startswith("chunk")
            held = _health(server)
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # the agent dies mid-lease, mid-stream
            proc.wait(timeout=30)
        if time.monotonic() - t_leased < 2.0:  # read well before its 3 s deadline: the lease was held then
            assert held["leases"] == 1 and held["leased_blocks"] > 0
        time.sleep(max(0.0, t_leased + 3.5 - time.monotonic()))  # past the deadline (the server's clock ran first)
        gauges = _health(server)
        deadline = time.monotonic() + 30
        while gauges["running"] and time.monotonic() < deadline:  # the cancelled stream leaves at the next step
            time.sleep(0.2)
            gauges = _health(server)
        assert (gauges["leases"], gauges["leased_blocks"], gauges["running"]) == (0, 0, 0), json.dumps(gauges)
        assert gauges["locked_blocks"] == 0 and gauges["held_blocks"] == 0
