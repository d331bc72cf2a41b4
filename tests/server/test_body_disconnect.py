"""A client that goes away while sending its body (an agent cancelling its request mid-upload, a dropped mobile
link) was counted as a server bug: `radixcache_http_errors_total{status="500"}` and a traceback in the log (before
that, FastAPI's 400 "could not parse the JSON body"). It is a 499, as a client gone later is. A real uvicorn server
on 127.0.0.1 in a thread, raw sockets that close mid-body."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.server.uvicorn_thread import serving

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    m = tiny_model(seed=4)
    with Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64) as e:
        yield e


def _errors(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    prefix = "radixcache_http_errors_total{status="
    return {
        line[len(prefix) + 1 : line.index("}") - 1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


@pytest.mark.parametrize(
    "sent",
    [
        HEAD + b"Content-Length: 1000\r\n\r\n",  # headers only
        HEAD + b"Content-Length: 1000\r\n\r\n" + b'{"model": "tiny", "prompt"',  # part of the body
        HEAD
        + b"Content-Length: 400000\r\n\r\n"
        + b'{"model": "tiny", "prompt": "'
        + b"x" * 300_000,  # a big one's part
        HEAD + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"mod\r\n',  # a chunked body never ended
    ],
)
def test_a_client_gone_mid_body_is_a_499_not_a_server_error(engine: Engine, sent: bytes) -> None:
    app = create_app(engine, "tiny")
    with serving(app) as port:
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(sent)
            time.sleep(0.2)  # the server reads what came before the client leaves
        deadline = time.monotonic() + 30
        while not (errors := _errors(port)) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert errors == {"499": 1.0}
