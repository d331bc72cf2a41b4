"""A client that sends its body a byte at a time, each byte well within the per-read bound (`stream_stall_timeout`),
held its connection and request forever: the bound was per read. Now a body must average `min_body_rate` bytes a
second after `body_grace` seconds (runtime.server.body_limit): the trickle gets 408 and its connection closes, while
a slow but steady upload is served. A real uvicorn server on 127.0.0.1 (in a thread) and raw sockets."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.server.body_limit import BODY_GRACE_S, MIN_BODY_RATE
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.server.uvicorn_thread import serving

GIVE_UP_S = 60.0  # the trickle's client stops here: before, no answer ever came (each byte was within 60 s)
KEEPS_TRICKLING_S = 12.0  # past uvicorn's keep-alive timeout (5 s), which each byte put off: before, open throughout


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    m = tiny_model(seed=2)
    with Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64) as e:
        yield e


def _head(length: int) -> bytes:
    return (
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_a_trickling_body_gets_408_and_its_connection_closes(engine: Engine) -> None:
    app = create_app(engine, "tiny", body_grace=1.0, min_body_rate=100.0)  # the per-read bound stays 60 s
    with serving(app) as port, socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(_head(10_000) + b"{")
        client.settimeout(0.25)
        answer, sent, deadline = b"", 1, time.monotonic() + GIVE_UP_S
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            try:
                answer += client.recv(4096)  # a byte every 0.25 s: each far inside the per-read bound
            except TimeoutError:
                client.sendall(b" ")
                sent += 1
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert sent < 10_000  # refused long before the body could have been whole
        closed, deadline = False, time.monotonic() + KEEPS_TRICKLING_S
        while not closed and time.monotonic() < deadline:  # the client trickles on: each byte kept the connection
            try:
                chunk = client.recv(4096)
                answer, closed = answer + chunk, not chunk
            except TimeoutError:
                try:
                    client.sendall(b" ")
                except OSError:  # reset: closed by the server
                    closed = True
        assert closed, "the connection stayed open while the client trickled on after its 408"
        assert b"connection: close" in answer.split(b"\r\n\r\n", 1)[0].lower()
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        assert "too slowly" in error["message"], error


def test_a_slow_but_steady_body_is_served(engine: Engine) -> None:
    app = create_app(engine, "tiny", body_grace=1.0, min_body_rate=100.0)
    body = json.dumps({"model": "tiny", "prompt": "steady", "max_tokens": 2, "temperature": 0}).encode()
    body = body[:1] + b" " * (1500 - len(body)) + body[1:]  # 1500 bytes at about 500 a second: 3 s, never behind
    with serving(app) as port, socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(_head(len(body)))
        for start in range(0, len(body), 50):
            client.sendall(body[start : start + 50])
            time.sleep(0.1)
        client.settimeout(60)
        answer = client.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer


class _Made(Exception):
    """Raised where the app would be made: the test ends there, before uvicorn runs."""


@pytest.mark.parametrize(
    ("args", "expected"),
    [([], (BODY_GRACE_S, MIN_BODY_RATE)), (["--body-grace", "5", "--min-body-rate", "0"], (5.0, 0.0))],
)
def test_the_body_rate_flags_reach_the_app(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, args, expected
) -> None:
    import radixcache.runtime.server as server
    from radixcache.cli.main import main

    seen = {}

    def capture(engine: object, name: str, **kwargs: object) -> None:
        seen.update(kwargs)
        raise _Made

    monkeypatch.setattr(server, "create_app", capture)
    result = CliRunner().invoke(main, ["serve", "--model", str(tiny_model_dir), "--port", "0", "--debug", *args])
    assert isinstance(result.exception, _Made), result.output
    assert (seen.get("body_grace", BODY_GRACE_S), seen.get("min_body_rate", MIN_BODY_RATE)) == expected


@pytest.mark.parametrize("args", [["--min-body-rate", "nan"], ["--min-body-rate", "-1"], ["--body-grace", "inf"]])
def test_a_body_rate_no_body_could_keep_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    from radixcache.cli.main import main

    result = CliRunner().invoke(main, ["serve", "--model", str(tmp_path / "no-model"), *args])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{args[0]}'" in result.output
