"""A bound on a request body's bytes, so that one client cannot make the server hold gigabytes for everyone.

Every field of a request is bounded (runtime.server.protocol), but only once the whole body has been read and parsed,
and uvicorn reads any body it is sent: a client posting a few GB (by mistake or not) took that much memory from the
process serving everyone else. `BodyLimit` refuses a body past `limit` bytes with OpenAI's 413 error before reading
it whole: at once when its Content-Length says so, else (a chunked body) as soon as the bytes read pass the limit.
The refusal is raised where the route reads the body, so the app's handler answers it in OpenAI's shape.

A client that sent its headers and part of its body, then nothing more (a Content-Length larger than what it
sent, a chunked body it never ends), held the connection and its request's task forever: uvicorn has no timeout
on a body's reads. With `idle`, a body whose next bytes take longer gets 408, the same way.

That bound is per read: a client sending one byte every `idle` - 1 seconds held the connection, its task and what
it had sent for as long as it liked (days, for a 64 MiB Content-Length). With `min_rate`, a body must also keep up
an average rate, as Apache's mod_reqtimeout asks (`body=20,MinRate=500`): it may take `grace` seconds from the
request's start, plus one second per `min_rate` bytes it has sent; past that it gets 408 too. A slow but steady
upload (any average above `min_rate`) is never cut, however long it takes; a stalled or trickling one is, after
`grace` seconds and the credit of what it sent. Each refusal (413, 408) closes the connection once it is sent.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from starlette.exceptions import HTTPException

DEFAULT_MAX_BODY_BYTES = 64 << 20  # 64 MiB: the largest prompts any model here takes are a few MB of JSON
BODY_GRACE_S = 20.0  # create_app's default: the seconds any body may take, before its rate counts
MIN_BODY_RATE = 500.0  # create_app's default: bytes a second a body must average past its grace (as Apache's)
# on every refusal here: the body's unread rest would otherwise be read (and dropped) on a kept-alive connection, and
# a client trickling it on after its 408 held the connection as long as before (each byte put off keep-alive's timeout)
_CLOSE = {"Connection": "close"}


def check_max_body_bytes(limit: object) -> int:
    """`limit` when it is an int >= 1, else a ValueError naming max_body_bytes."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_body_bytes must be an int >= 1, got {limit!r}")
    return limit


def check_body_rate(grace: float, min_rate: float | None) -> None:
    """A ValueError naming body_grace or min_body_rate unless each is a finite number >= 0 (min_rate: or None)."""
    for name, value in (("body_grace", grace), ("min_body_rate", min_rate)):
        if value is not None and (isinstance(value, bool) or not (math.isfinite(value) and value >= 0)):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class BodyLimit:
    """ASGI middleware: an HTTP request whose body passes `limit` bytes gets 413 (`HTTPException`, raised from the
    body's reads, so nothing past the limit is held), one whose unfinished body sends nothing for `idle` seconds
    408 (None: it may wait forever), and one whose unfinished body is still arriving `grace` seconds after the
    request began plus a second per `min_rate` bytes sent 408 as well (None or 0: no rate is asked)."""

    def __init__(
        self,
        app: Any,
        limit: int,
        idle: float | None = None,
        grace: float = BODY_GRACE_S,
        min_rate: float | None = None,
    ) -> None:
        check_body_rate(grace, min_rate)
        self.app, self.limit, self.idle = app, check_max_body_bytes(limit), idle
        self.grace, self.min_rate = grace, min_rate or None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        seen, whole = 0, False
        loop = asyncio.get_running_loop()
        began = loop.time()

        async def bounded_receive() -> Any:
            nonlocal seen, whole
            if declared is not None and declared > self.limit:
                raise self._too_large()
            wait, slow = self.idle, False
            if self.min_rate is not None:  # the credit left: grace, plus a second per min_rate bytes, less time spent
                credit = began + self.grace + seen / self.min_rate - loop.time()
                wait, slow = (credit, True) if wait is None or credit < wait else (wait, False)
            if whole or wait is None:  # once the body is in, a receive waits for the disconnect: unbounded
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(wait, 0.0))
                except asyncio.TimeoutError:
                    raise self._too_slow(seen) if slow else self._idle() from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.limit:
                    raise self._too_large()
            return message

        await self.app(scope, bounded_receive, send)

    def _idle(self) -> HTTPException:
        return HTTPException(408, f"The request body sent nothing for {self.idle:g} s.", _CLOSE)

    def _too_slow(self, seen: int) -> HTTPException:
        return HTTPException(
            408,
            f"The request body arrives too slowly: {seen} bytes so far, where this server asks for "
            f"{self.min_rate:g} bytes a second after the first {self.grace:g} s.",
            _CLOSE,
        )

    def _too_large(self) -> HTTPException:
        return HTTPException(413, f"The request body is larger than this server's limit of {self.limit} bytes.", _CLOSE)


def _content_length(scope: Any) -> int | None:
    """The Content-Length header's value, or None where there is none (or it is not a number: uvicorn refuses those)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
