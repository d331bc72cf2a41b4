"""What every route of the server shares over HTTP: the caller's API key (`tenant`, `ApiKey`), waiting on work
unless the client goes away (`until_disconnect`), and SSE streams that answer only once their first event exists
and cancel their engine requests however they end (`first_event`, `prepend`, `ClosingStreamingResponse`), a client
that stops reading included (`STREAM_STALL_S`). `head_routes` answers HEAD on every GET route."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute

from radixcache.runtime.server.protocol import APIError

STREAM_STALL_S = 60.0  # create_app's default: a stream whose next chunk waits this long to be sent is given up
_log = logging.getLogger("radixcache.server")


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the response ends. When the client goes away
    while a chunk is being sent, Starlette abandons the iterator suspended at its `yield`, and only its finalizer
    would close it (and so cancel the engine requests behind it), once the garbage collector breaks the cycle the
    exception's traceback makes: until then the engine goes on generating for nobody, up to max_tokens.

    A client that keeps the connection open but stops reading fills the socket's buffers, and then uvicorn holds
    each chunk until the client reads; meanwhile the engine goes on generating and the chunks wait in memory, up to
    max_tokens. A chunk that waits past the app's `stream_stall_timeout` (create_app) gives the stream up: the body
    ends with its error (code `stream_stalled`: the SSE stream's own error event, then `[DONE]` or
    `response.failed`), which cancels its requests at once (their KV and locks freed); the error goes out if the
    client reads again within another such wait, else the body stays unfinished (uvicorn then closes the
    connection once its buffered bytes are read: the client reads a cut response, never a whole one)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = scope.get("app")
        stall = getattr(app.state, "stream_stall_timeout", None) if app is not None else None

        async def bounded_send(message: Any) -> None:
            if stall is None or message.get("type") != "http.response.body":
                return await send(message)
            try:
                await _within(send(message), stall)
            except asyncio.TimeoutError:
                raise _Stalled from None

        try:
            await super().__call__(scope, receive, bounded_send)
        except _Stalled:
            await self._give_up(send, stall)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]

    async def _give_up(self, send: Any, stall: float) -> None:
        """End the body with the stall's error: its generator's last chunks, all taken before anything waits on the
        client (the generator cancels its requests as it ends), then sent within `stall` seconds if at all."""
        _log.warning("a stream's client read nothing for %g s: its requests are cancelled", stall)
        error = APIError(
            408, f"the client read nothing for {stall:g} s: the stream was cancelled", code="stream_stalled"
        )
        chunks: list[Any] = []
        with contextlib.suppress(Exception):  # a generator that does not catch it, or that ended, has nothing to add
            chunks.append(await self.body_iterator.athrow(error))  # type: ignore[attr-defined]
            chunks += [chunk async for chunk in self.body_iterator]
        await self.body_iterator.aclose()  # type: ignore[attr-defined]
        body = b"".join(c.encode(self.charset) if isinstance(c, str) else bytes(c) for c in chunks)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(send({"type": "http.response.body", "body": body, "more_body": False}), stall)


async def _within(send: Awaitable[None], seconds: float) -> None:
    """`await send`, a TimeoutError past `seconds`. Once a chunk: `asyncio.timeout` (3.11) arms a timer in this task,
    where `wait_for` (before 3.12) ran each chunk's send in a task of its own, 50 us a chunk on the event loop."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:  # Python 3.10
        return await asyncio.wait_for(send, seconds)
    async with timeout(seconds):
        await send


class _Stalled(Exception):
    """A stream's chunk could not be sent within the stall timeout."""


class KeysFirst:
    """ASGI middleware: a /v1 request without one of the app's API keys gets 401 before its body is even read (as
    OpenAI answers); `refuse` makes the response. Plain ASGI, not Starlette's BaseHTTPMiddleware, which relays every
    response's body through a stream of its own and ends it well however the app ended: a stream that
    ClosingStreamingResponse leaves unfinished (a stalled client's, whose error could not be sent) read as complete
    to a client that read again later, though it had neither its error nor `[DONE]`."""

    def __init__(self, app: Any, refuse: Callable[[Request, APIError], Awaitable[Any]]) -> None:
        self.app, self.refuse = app, refuse

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # OPTIONS passes: a browser's CORS preflight never carries the key, and this server has no CORS, so the
        # router answers it as any method no route has (405 with Allow), not as a missing key
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            request = Request(scope, receive)
            if request.url.path.startswith("/v1"):
                try:
                    tenant(request)
                except APIError as exc:
                    await (await self.refuse(request, exc))(scope, receive, send)
                    return
        await self.app(scope, receive, send)


async def first_event(events: AsyncIterator[Any]) -> Any:
    try:
        return await events.__anext__()
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise


async def prepend(first: Any, events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work` unless the client goes away first; then cancel it (its engine requests too) and answer 499."""
    task = asyncio.ensure_future(work)
    gone = asyncio.create_task(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise APIError(499, "client disconnected")
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read; only the disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def tenant(request: Request) -> str | None:
    """The caller's API key (None without configured keys); 401 when keys are configured and it has none of them."""
    keys = request.app.state.api_keys
    if not keys:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or token.strip() not in keys:
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    return token.strip()


ApiKey = Annotated[str | None, Depends(tenant)]


def head_routes(app: FastAPI) -> None:
    """HEAD on every GET route of `app` (FastAPI answers 405 to it): uptime monitors probe /health with HEAD, and a
    405 reads as down. The same endpoint, its key check included; the server (uvicorn) sends no body. Left out of
    the OpenAPI schema, which the schemathesis tests fuzz (tests/server/test_schemathesis_fuzz.py)."""
    for route in list(app.routes):
        if isinstance(route, APIRoute) and route.methods == {"GET"}:
            app.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                include_in_schema=False,
                response_class=route.response_class,
                name=route.name,
            )
