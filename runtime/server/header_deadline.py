"""A deadline on a request's headers, which uvicorn does not have.

uvicorn (h11) arms no timer while a connection's request headers arrive: a client that connected and sent nothing,
or sent a request line and then a header byte every few seconds, held its connection (a file descriptor, a
protocol object) for as long as it liked, and a few thousand such clients used up the process's descriptors
(slowloris). runtime.server.body_limit bounds the body, but only once the headers are in and the app has the
request. `header_deadline_protocol(seconds)` is an h11 protocol class for `uvicorn.Config(http=...)` under which a
request's headers must be whole within `seconds`: counted from the connection's start for its first request, and
from the first byte of each later one (an idle keep-alive connection is uvicorn's `timeout_keep_alive`'s). Past
that the client gets 408 and the connection closes, as Apache's `RequestReadTimeout header=20` and nginx's
`client_header_timeout` do.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 20.0  # `radixcache serve`'s default (--header-timeout)
_LATE = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def header_deadline_protocol(seconds: float = HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol, with a request's headers due within `seconds` (a finite number > 0)."""
    if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"the header timeout must be a finite number of seconds > 0, got {seconds!r}")

    class HeaderDeadline(H11Protocol):
        header_timeout = seconds
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:  # a request's headers not yet whole: its first bytes start it
                if self._deadline is None:
                    self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(_LATE)  # no request was read: h11 has nothing to answer, so the bytes are ours
                self.transport.close()

    return HeaderDeadline
