"""serve binds its socket before the model loads (cli/serve.py `_bind`) and hands it to uvicorn. asyncio turns
Nagle's algorithm off (TCP_NODELAY) only on the connections of a socket whose proto is IPPROTO_TCP; the bound socket
had proto 0, so every response on a keep-alive connection waited for the client's delayed ACK: 44 ms a request where
uvicorn's own socket answers in 1 ms."""

from __future__ import annotations

import asyncio
import socket

from radixcache.cli.serve import _bind


def test_the_servers_connections_send_without_nagles_delay() -> None:
    async def connection_options() -> tuple[int, int]:
        listener = _bind("127.0.0.1", 0)
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=listener)  # as uvicorn serves a socket it is given
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
        return listener.proto, nodelay

    proto, nodelay = asyncio.run(connection_options())
    assert proto == socket.IPPROTO_TCP and nodelay != 0
