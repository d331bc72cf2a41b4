"""The server's sockets, bound before the model loads and handed to uvicorn.

Binding first makes a taken address fail in one line (uvicorn would log and exit after the load) and lets the start
line name the port `--port 0` took. The sockets are bound but not listening, so a client is refused until the server
starts; the address is not reserved meanwhile (SO_REUSEADDR: a second server loading at the same time fails when
uvicorn listens, as before).

One socket per address the host resolves to, as asyncio's own `create_server` binds (localhost may be 127.0.0.1
and ::1; an IPv6 socket is IPv6 only). Each is made with proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on the
connections of such a socket, and without it every response on a keep-alive connection waited for the client's
delayed ACK (44 ms a request, where 1 ms is the server's own time).

`drop_unread` bounds how long a connection's sent bytes may wait on a client that reads nothing (TCP_USER_TIMEOUT,
which the accepted connections inherit): a whole (non-streaming) response goes into the connection's buffer at
once, so no write of the app's waits on the client, and a client that never read it kept the socket and the
response's bytes in memory forever (asyncio closes a connection only once its buffer is sent).
"""

from __future__ import annotations

import socket


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound TCP sockets for `host`:`port` (port 0: one port the kernel picks, the same for every address). An
    OSError saying which address could not be had closes every socket made before it."""
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):  # getaddrinfo may repeat an address
            s = socket.socket(family, kind, proto)
            sockets.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # else it would take the IPv4 port too, which the AF_INET socket binds
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((address[0], port, *address[2:]))
            port = s.getsockname()[1]  # port 0: the next addresses take the port the first one got
    except OSError as exc:
        for s in sockets:
            s.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sockets


_MAX_USER_TIMEOUT_MS = 2**31 - 1  # the kernel's option is a signed 32-bit count of milliseconds


def drop_unread(sockets: list[socket.socket], seconds: float) -> None:
    """Have the kernel drop a connection of these listening sockets whose sent bytes wait `seconds` unacknowledged
    or unsent behind a zero receive window (a client that stopped reading): the connection then ends with
    ETIMEDOUT, which frees its buffers as a disconnect does. Where the platform lacks TCP_USER_TIMEOUT, nothing.
    The kernel takes at most 2**31 - 1 ms (24.8 days): a longer `seconds` is that (setsockopt refused a larger int
    with a TypeError, so `--stream-stall-timeout 1e9` ended serve in a traceback)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is None:
        return
    millis = min(_MAX_USER_TIMEOUT_MS, max(1, round(seconds * 1000)))
    for s in sockets:
        s.setsockopt(socket.IPPROTO_TCP, option, millis)
