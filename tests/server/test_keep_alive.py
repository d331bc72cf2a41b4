"""`radixcache serve --keep-alive`: an idle connection stays open past httpx's 5 s pool expiry by default (the
openai client reuses it then; uvicorn's own 5 s default would be closing it as the request arrives, a reset), and
closes after the seconds given. Raw sockets, so that no client pool hides a reconnect."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit


def _get_health(sock: socket.socket) -> int:
    """One HTTP/1.1 GET /health on `sock` (kept alive); its status code."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return int(head.split(b" ")[1])


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=30)


def test_an_idle_connection_outlives_httpx_pool_expiry(server) -> None:
    with _connect(server.url) as sock:
        assert _get_health(sock) == 200
        time.sleep(5.5)  # past httpx's keepalive_expiry and uvicorn's default timeout_keep_alive (both 5 s)
        assert _get_health(sock) == 200


def test_keep_alive_closes_an_idle_connection_after_the_seconds_given(launch, tiny_model_dir) -> None:
    with launch(tiny_model_dir, "--keep-alive", "1") as s, _connect(s.url) as sock:
        assert _get_health(sock) == 200
        sock.settimeout(2.5)  # the server's close ends the wait (about 1 s); still open at 2.5 s: TimeoutError
        assert sock.recv(1) == b""  # closed by the server
