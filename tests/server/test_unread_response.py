"""A client that sends a non-streaming request and never reads its response. The whole body goes into the
connection's buffer at once (no write of the app's waits on the client, so the stream's stall bound never applied),
and asyncio closes a connection only once that buffer is sent: the server kept the socket and the response's bytes
for as long as the client kept its end open, past the keep-alive close too. `radixcache serve` now has the kernel
drop such a connection once its bytes wait `--stream-stall-timeout` seconds on a client that reads nothing
(TCP_USER_TIMEOUT). And the other way round: a client that stops sending its body half-way gets 408 after as long.
A real server on 127.0.0.1 (one for the module) and raw sockets."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server

STALL_S = 1.0

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux's TCP options"
    ),
    pytest.mark.xdist_group("unread_response"),  # one worker runs the module: its server starts once, not per worker
]


def _established(server_port: int, client_port: int) -> bool:
    """Whether the server's end of the connection from `client_port` is still open (/proc/net/tcp, IPv4)."""
    want = f":{server_port:04X}", f":{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote = line.split()[1:3]
        if local.endswith(want[0]) and remote.endswith(want[1]):
            return True
    return False


@pytest.fixture(scope="module")
def stall_server(launch, tiny_model_dir: Path) -> Iterator[Server]:
    with launch(tiny_model_dir, "--stream-stall-timeout", str(STALL_S)) as server:
        yield server


def test_a_whole_response_nobody_reads_gives_its_connection_up(stall_server: Server) -> None:
    body = {"model": "tiny", "prompt": "never read", "max_tokens": 200, "n": 8, "logprobs": 5, "temperature": 1}
    raw = json.dumps(body).encode()
    server = stall_server
    port = int(server.url.rsplit(":", 1)[1])
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the buffers fill soon
        client.connect(("127.0.0.1", port))
        head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        client.sendall(head + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        received = client.recv(64)
        assert received.startswith(b"HTTP/1.1 200"), received  # the response is out; the client reads no more
        client_port = client.getsockname()[1]
        deadline = time.monotonic() + 60  # before: open for as long as the client's end was (the test's 60 s)
        while (still := _established(port, client_port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not still, "the server still holds a connection whose client read nothing"
        client.settimeout(10)
        try:  # what the client gets if it reads now: a cut response, never a whole one
            while chunk := client.recv(1 << 16):
                received += chunk
        except ConnectionResetError:
            pass
    head_bytes, _, got = received.partition(b"\r\n\r\n")
    length = int(next(h for h in head_bytes.split(b"\r\n") if h.lower().startswith(b"content-length:"))[15:])
    assert len(got) < length
    # the server goes on serving, and the request left nothing locked
    r = httpx.post(server.v1 + "/completions", json={**body, "n": 1, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    assert server.locked_blocks_settled() == 0


@pytest.mark.parametrize("chunked", [False, True], ids=["short-content-length", "unended-chunks"])
def test_a_body_that_stops_arriving_is_a_408(stall_server: Server, chunked: bool) -> None:
    """A client that sends its headers and part of its body, then nothing (a Content-Length larger than what it
    sent, a chunked body it never ends), held its connection and request task forever: uvicorn has no timeout on a
    body's reads. Now the body's next bytes may wait --stream-stall-timeout, then the request is a 408."""
    port = int(stall_server.url.rsplit(":", 1)[1])
    part = b'{"model": "tiny", "prompt": "never ends"'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    if chunked:
        sent = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(part), part)
    else:
        sent = head + b"Content-Length: %d\r\n\r\n" % (len(part) + 100) + part
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(sent)
        client.settimeout(60)  # before: no answer at all
        received = b""
        while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
            chunk = client.recv(1 << 16)
            if not chunk:
                break
            received += chunk
    head_bytes, _, body = received.partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 408"), received
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and "sent nothing for" in error["message"], error
    r = httpx.post(
        stall_server.v1 + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200
