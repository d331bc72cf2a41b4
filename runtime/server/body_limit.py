"""A bound on a request body's bytes, so that one client cannot make the server hold gigabytes for everyone.

Every field of a request is bounded (runtime.server.protocol), but only once the whole body has been read and parsed,
and uvicorn reads any body it is sent: a client posting a few GB (by mistake or not) took that much memory from the
process serving everyone else. `BodyLimit` refuses a body past `limit` bytes with OpenAI's 413 error before reading
it whole: at once when its Content-Length says so, else (a chunked body) as soon as the bytes read pass the limit.
The refusal is raised where the route reads the body, so the app's handler answers it in OpenAI's shape.

A client that sent its headers and part of its body, then nothing more (a Content-Length larger than what it
sent, a chunked body it never ends), held the connection and its request's task forever: uvicorn has no timeout
on a body's reads. With `idle`, a body whose next bytes take longer gets 408, the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.exceptions import HTTPException

DEFAULT_MAX_BODY_BYTES = 64 << 20  # 64 MiB: the largest prompts any model here takes are a few MB of JSON


def check_max_body_bytes(limit: object) -> int:
    """`limit` when it is an int >= 1, else a ValueError naming max_body_bytes."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_body_bytes must be an int >= 1, got {limit!r}")
    return limit


class BodyLimit:
    """ASGI middleware: an HTTP request whose body passes `limit` bytes gets 413 (`HTTPException`, raised from the
    body's reads, so nothing past the limit is held), one whose unfinished body sends nothing for `idle` seconds
    408 (None: it may wait forever)."""

    def __init__(self, app: Any, limit: int, idle: float | None = None) -> None:
        self.app, self.limit, self.idle = app, check_max_body_bytes(limit), idle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        seen, whole = 0, False

        async def bounded_receive() -> Any:
            nonlocal seen, whole
            if declared is not None and declared > self.limit:
                raise self._too_large()
            if whole or self.idle is None:  # once the body is in, a receive waits for the disconnect: unbounded
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), self.idle)
                except asyncio.TimeoutError:
                    raise HTTPException(408, f"The request body sent nothing for {self.idle:g} s.") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.limit:
                    raise self._too_large()
            return message

        await self.app(scope, bounded_receive, send)

    def _too_large(self) -> HTTPException:
        return HTTPException(413, f"The request body is larger than this server's limit of {self.limit} bytes.")


def _content_length(scope: Any) -> int | None:
    """The Content-Length header's value, or None where there is none (or it is not a number: uvicorn refuses those)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
