"""A streaming client that keeps its connection open but stops reading: once the socket's buffers are full, each
chunk waits in uvicorn until the client reads. Past the app's `stream_stall_timeout` the stream is given up, as a
disconnect is: its request is cancelled (KV and locks freed) long before max_tokens. Before, the engine generated
to max_tokens for nobody, the KV and the unsent chunks held until then. A real uvicorn server on 127.0.0.1 (in a
thread, over the tiny random model) and a raw socket client with a small receive buffer that reads the status line
and nothing more."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import h11
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.server import uvicorn_thread

MAX_TOKENS = 6000


def serving(app: Any) -> AbstractContextManager[int]:
    """`app` under uvicorn on a free port of 127.0.0.1, in a thread; stopped on exit. Small send buffers, which the
    accepted sockets inherit: loopback's grow to megabytes, which a short stream fills not (a real client's window is
    smaller than loopback's)."""
    return uvicorn_thread.serving(app, send_buffer=4096)


@pytest.fixture
def engine() -> Iterator[Engine]:
    m = tiny_model(seed=5, max_position=MAX_TOKENS + 64)
    tok = CharTokenizer(m.config.vocab_size)
    with Engine(RandomModel(m.config, m.weights, tok), capacity_blocks=(MAX_TOKENS + 64) // 16 + 8) as e:
        yield e


@pytest.mark.slow  # a real server, and a thousand tokens before the buffers fill
def test_a_client_that_stops_reading_has_its_stream_cancelled(engine: Engine) -> None:
    app = create_app(engine, "tiny", stream_stall_timeout=1.0)
    body = {"model": "tiny", "prompt": "never read", "max_tokens": MAX_TOKENS, "stream": True, "temperature": 0}
    body["logit_bias"] = {str(engine.eos_token_ids[0]): -100}  # no early end
    raw = json.dumps(body).encode()
    with serving(app) as port, socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the buffers fill soon
        client.connect(("127.0.0.1", port))
        head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        client.sendall(head + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        received = client.recv(64)
        assert received.startswith(b"HTTP/1.1 200")  # the stream began; from here on the client reads nothing
        assert engine.wait_idle(120), "the request never ended"
        generated = engine.stats.generated_tokens
        assert app.state.inflight.cancelled == 1
        assert 0 < generated < MAX_TOKENS / 2, generated  # before: all MAX_TOKENS, for a client that read none
        assert engine.check()["locked_blocks"] == 0
        client.settimeout(5)
        with contextlib.suppress(TimeoutError):  # the connection stays open (keep-alive) once the body ended:
            while not received.endswith(b"\r\n0\r\n\r\n") and (chunk := client.recv(1 << 16)):  # read to its end
                received += chunk
    events = [line[6:] for line in received.decode().split("\n") if line.startswith("data: {")]
    chunks = [json.loads(e) for e in events]
    assert len(chunks) > 100 and not any(c["choices"][0]["finish_reason"] for c in chunks if "choices" in c)
    errors = [c["error"] for c in chunks if "error" in c]  # sent if the client read again soon enough
    assert all(e["code"] == "stream_stalled" for e in errors) and len(errors) <= 1


def test_a_chunk_is_sent_in_the_streams_own_task() -> None:
    """The stall's bound ran each chunk's send through asyncio.wait_for, which (before Python 3.12) made a task per
    chunk: 50 us of event-loop work a token of every stream. The bound is a timer in the stream's own task."""
    from types import SimpleNamespace

    from radixcache.runtime.server.http_common import ClosingStreamingResponse

    async def body() -> Any:
        for i in range(3):
            yield f"data: {i}\n\n"

    async def run() -> list[bool]:
        own = asyncio.current_task()
        in_own: list[bool] = []

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                in_own.append(asyncio.current_task() is own)

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        app = SimpleNamespace(state=SimpleNamespace(stream_stall_timeout=60.0))
        scope = {"type": "http", "app": app, "asgi": {"spec_version": "2.4"}}
        await ClosingStreamingResponse(body(), media_type="text/event-stream")(scope, receive, send)
        return in_own

    assert asyncio.run(run()) == [True] * 4  # 3 chunks and the body's end


def _returning(app: Any, returned: threading.Event) -> Any:
    """`app`, setting `returned` once its answer to an HTTP request returns."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                returned.set()

    return wrapped


@pytest.mark.slow  # a real server, and a thousand tokens before the buffers fill
def test_a_stalled_stream_whose_error_went_unsent_does_not_end_as_a_whole_one(engine: Engine) -> None:
    """The client reads again only after the stream was given up and its error could not be sent either: what it
    reads must not parse as a whole response. The app's key middleware (Starlette's BaseHTTPMiddleware) relayed the
    body and ended it well once the app returned: a client read a cut stream, with neither the error nor `[DONE]`,
    as a complete one. Now the body is left unfinished: uvicorn closes the connection after the bytes it holds."""
    app = create_app(engine, "tiny", api_keys=["sk-a"], stream_stall_timeout=1.0)
    returned = threading.Event()
    body = {"model": "tiny", "prompt": "never read", "max_tokens": MAX_TOKENS, "stream": True, "temperature": 0}
    body["logit_bias"] = {str(engine.eos_token_ids[0]): -100}
    raw = json.dumps(body).encode()
    with serving(_returning(app, returned)) as port, socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer sk-a\r\n"
        client.sendall(head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)
        received = client.recv(64)
        assert received.startswith(b"HTTP/1.1 200")
        assert engine.wait_idle(120), "the request never ended"
        returned.wait(30)  # given up, then its error waits one more second to be sent (before: until the client read)
        client.settimeout(10)
        with contextlib.suppress(TimeoutError):
            while chunk := client.recv(1 << 16):
                received += chunk
    parser = h11.Connection(h11.CLIENT)
    parser.send(
        h11.Request(method="POST", target="/v1/completions", headers=[("Host", "test"), ("Content-Length", "0")])
    )
    parser.send(h11.EndOfMessage())
    parser.receive_data(received)
    parser.receive_data(b"")  # the connection's end, as the client saw it
    events, text = [], b""
    with contextlib.suppress(h11.RemoteProtocolError):  # an unfinished chunked body: what a client reports
        while (event := parser.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            events.append(type(event).__name__)
            text += getattr(event, "data", b"")
            if isinstance(event, h11.ConnectionClosed):
                break
    assert events[0] == "Response" and len(text) > 10_000
    assert b"stream_stalled" not in text  # the client read nothing in time: the error was not sent
    assert "EndOfMessage" not in events, text[-300:]  # before: the body ended well, without the error or [DONE]
