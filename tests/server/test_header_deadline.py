"""uvicorn arms no timer while a request's headers arrive: a client that connected and sent nothing, or sent a
request line and then a header byte every quarter second, held its connection forever (slowloris). Under
`header_deadline_protocol` (what `radixcache serve` runs, `--header-timeout`) the headers must be whole within the
deadline: then 408 and the connection closes. A keep-alive connection idle between requests is not cut by it. A real
uvicorn server on 127.0.0.1 in a thread, raw sockets."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from radixcache.runtime.server.header_deadline import HEADER_TIMEOUT_S, header_deadline_protocol
from tests.server.uvicorn_thread import serving

GIVE_UP_S = 30.0  # the clients stop here: before, no answer ever came
REQUEST = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"


async def ok(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _response(client: socket.socket) -> bytes:
    """One whole response of `ok`."""
    response = b""
    while not response.endswith(b"\r\n\r\nok"):
        chunk = client.recv(4096)
        assert chunk, response
        response += chunk
    return response


def _answer(client: socket.socket, trickle: bytes | None) -> bytes:
    """What the server sends until it closes the connection, the client sending a byte of `trickle` every 0.25 s
    (None: nothing) meanwhile."""
    client.settimeout(0.25)
    answer, deadline = b"", time.monotonic() + GIVE_UP_S
    while time.monotonic() < deadline:
        try:
            chunk = client.recv(4096)
        except TimeoutError:
            if trickle:
                client.sendall(trickle[:1])
                trickle = trickle[1:] or b"X"
            continue
        if not chunk:
            return answer
        answer += chunk
    raise AssertionError(f"the connection is still open after {GIVE_UP_S} s: {answer!r}")


@pytest.mark.parametrize("first", [b"", b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: "])
def test_headers_that_never_end_get_408_and_a_closed_connection(first: bytes) -> None:
    with serving(ok, http=header_deadline_protocol(1.0)) as port, socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(first)
        answer = _answer(c, b"abcdefgh" if first else None)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_keep_alive_connection_idle_past_the_deadline_serves_its_next_request() -> None:
    with serving(ok, http=header_deadline_protocol(1.0)) as port, socket.create_connection(("127.0.0.1", port)) as c:
        c.settimeout(30)
        c.sendall(REQUEST)
        assert _response(c).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.5)  # idle past the header deadline, within uvicorn's keep-alive (5 s)
        c.sendall(REQUEST)
        assert _response(c).startswith(b"HTTP/1.1 200 ")
        c.sendall(REQUEST[:10])  # a third request that stops halfway: its own deadline runs from its first byte
        answer = _answer(c, b"Y" * 100)
    assert answer.startswith(b"HTTP/1.1 408 "), answer


class _Made(Exception):
    """Raised where uvicorn's Config would be made: the test ends there."""


@pytest.mark.parametrize(("args", "expected"), [([], HEADER_TIMEOUT_S), (["--header-timeout", "2.5"], 2.5)])
def test_the_header_timeout_reaches_uvicorn(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, args, expected):
    import uvicorn

    from radixcache.cli.main import main

    seen: dict[str, Any] = {}

    def capture(app: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Made

    monkeypatch.setattr(uvicorn, "Config", capture)
    result = CliRunner().invoke(main, ["serve", "--model", str(tiny_model_dir), "--port", "0", "--debug", *args])
    assert isinstance(result.exception, _Made), result.output
    assert seen["http"].header_timeout == expected


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_header_timeout_no_request_could_meet_is_a_usage_error(tmp_path: Path, value: str) -> None:
    from radixcache.cli.main import main

    result = CliRunner().invoke(main, ["serve", "--model", str(tmp_path / "no-model"), "--header-timeout", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--header-timeout'" in result.output
