"""serve's sockets (cli/listen.py), bound before the model loads and handed to uvicorn: the connections asyncio
makes of them send without Nagle's delay (proto 0 left it on: 44 ms a keep-alive request), every address the host
resolves to is bound as asyncio's own server would, and no socket outlives a serve that fails."""

from __future__ import annotations

import asyncio
import gc
import re
import socket
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.listen import bind_sockets, drop_unread
from radixcache.cli.serve import serve


def _nodelay_of_a_connection(listeners: list[socket.socket]) -> int:
    async def run() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=listeners[0])  # as uvicorn serves a socket it is given
        async with server:
            host, port = listeners[0].getsockname()[:2]
            _, writer = await asyncio.open_connection(host, port)
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
        return nodelay

    return asyncio.run(run())


def test_the_servers_connections_send_without_nagles_delay() -> None:
    listeners = bind_sockets("127.0.0.1", 0)
    assert [s.proto for s in listeners] == [socket.IPPROTO_TCP]
    assert _nodelay_of_a_connection(listeners) != 0


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="no TCP_USER_TIMEOUT here")
@pytest.mark.parametrize(("seconds", "millis"), [(60.0, 60_000), (0.0001, 1), (1e9, 2**31 - 1), (9.2e9, 2**31 - 1)])
def test_the_unread_bound_is_set_in_milliseconds_within_the_kernels_range(seconds: float, millis: int) -> None:
    """`--stream-stall-timeout 1e9` (finite, accepted) asked setsockopt for 10**12 ms: a TypeError ended serve."""
    listeners = bind_sockets("127.0.0.1", 0)
    try:
        drop_unread(listeners, seconds)
        assert listeners[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == millis
    finally:
        for s in listeners:
            s.close()


def test_every_address_of_the_host_is_bound_on_one_port() -> None:
    want = {info[4][0] for info in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    listeners = bind_sockets("localhost", 0)
    try:
        assert {s.getsockname()[0] for s in listeners} == want
        assert len({s.getsockname()[1] for s in listeners}) == 1
    finally:
        for s in listeners:
            s.close()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 here")
def test_an_ipv6_address_is_bound_ipv6_only() -> None:
    try:
        (listener,) = bind_sockets("::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with listener:
        assert listener.family == socket.AF_INET6
        assert listener.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1


def test_a_taken_address_or_an_unknown_host_is_one_oserror_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=re.escape(f"cannot listen on 127.0.0.1:{port}")):
            bind_sockets("127.0.0.1", port)
    with pytest.raises(OSError, match=re.escape("cannot listen on no-such-host.invalid:0")):
        bind_sockets("no-such-host.invalid", 0)


@pytest.mark.parametrize("args", [["--model", "/nonexistent/model.gguf"], ["--model", "x", "--max-body-size", "lots"]])
def test_a_serve_that_fails_leaves_no_socket_open(args: list[str], tmp_path: Path) -> None:
    """The socket was bound before the option checks and the load, and only the server's own end closed it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        result = CliRunner().invoke(serve, [*args, "--port", "0"])
        del result  # its traceback holds the frame that held the socket
        gc.collect()
    assert not [w for w in caught if "unclosed" in str(w.message) and "socket" in str(w.message)]
