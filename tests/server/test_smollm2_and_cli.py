"""`radixcache serve` as a command: its help and one-line errors, settings refused before anything loads; and one
short run with the real SmolLM2."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from radixcache.cli.main import main


def test_help_shows_an_example(tmp_path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0 and "Example:" in result.output and "--api-key" in result.output


def test_a_taken_port_is_a_one_line_error(tiny_model_dir) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = [
            sys.executable,
            "-c",
            "from radixcache.cli.main import run; run()",
            "serve",
            "--model",
            str(tiny_model_dir),
        ]
        r = subprocess.run([*cmd, "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().startswith("error: cannot listen on 127.0.0.1")
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_port_0_serves_on_the_port_its_start_line_names(tiny_model_dir) -> None:
    """`--port 0` (any free port) printed `http://127.0.0.1:0/v1`: the port the server took was nowhere to be seen."""
    import httpx

    cmd = [sys.executable, "-c", "from radixcache.cli.main import run; run()", "serve", "--model", str(tiny_model_dir)]
    proc = subprocess.Popen([*cmd, "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        lines = iter(proc.stderr.readline, "")  # type: ignore[union-attr]  # ends when the process does
        line = next((x for x in lines if x.startswith("serving ")), "")  # printed once the app is built
        assert line, f"no start line; exit status {proc.poll()}"
        url = line.split(" on ", 1)[1].split(" ", 1)[0]  # http://127.0.0.1:PORT/v1
        assert not url.endswith(":0/v1"), line
        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                assert httpx.get(url.removesuffix("/v1") + "/health", timeout=2).json() == {"status": "ok"}
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"nothing answered on {url}")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("value", ["0", "-5MiB", "lots"])
def test_a_bad_max_body_size_is_refused_before_the_model_loads(value: str) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["serve", "--model", "/nonexistent", "--max-body-size", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--max-body-size'" in result.output


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_request_timeout_that_is_not_finite_is_refused_before_the_model_loads(value: str) -> None:
    """click's FloatRange lets nan and inf through: the server started, then refused every request that gave no
    `timeout` of its own with a 400 blaming the request ("timeout must be > 0 seconds ..., got nan")."""
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["serve", "--model", "/nonexistent", "--request-timeout", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--request-timeout'" in result.output and "not a finite number" in result.output


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_create_app_refuses_a_request_timeout_no_request_could_take(value: float) -> None:
    from radixcache.runtime import Engine
    from radixcache.runtime.server import create_app
    from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

    m = tiny_model(seed=1)
    engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=16)
    with engine, pytest.raises(ValueError, match="request_timeout must be a finite number of seconds > 0"):
        create_app(engine, "tiny", request_timeout=value)


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2_server")  # the shared server (conftest.py)
def test_smollm2_answers_and_reuses_its_system_prompt(smollm2_server) -> None:
    import openai

    client = openai.OpenAI(base_url=smollm2_server.v1, api_key="unused", max_retries=0, timeout=120)
    system = {"role": "system", "content": "You are a concise geography tutor. Answer in a few words. " * 3}
    ask = [system, {"role": "user", "content": "What is the capital of France?"}]
    first = client.chat.completions.create(model="smollm2", messages=ask, max_tokens=12, temperature=0)
    assert "Paris" in first.choices[0].message.content
    again = [system, {"role": "user", "content": "What is the capital of Italy?"}]
    second = client.chat.completions.create(model="smollm2", messages=again, max_tokens=12, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= 32
