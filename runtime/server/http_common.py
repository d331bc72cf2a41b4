"""What every route of the server shares over HTTP: the caller's API key (`tenant`, `ApiKey`), waiting on work
unless the client goes away (`until_disconnect`), and SSE streams that answer only once their first event exists
and cancel their engine requests however they end (`first_event`, `prepend`, `ClosingStreamingResponse`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse

from radixcache.runtime.server.protocol import APIError


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that closes its body iterator however the response ends. When the client goes away
    while a chunk is being sent, Starlette abandons the iterator suspended at its `yield`, and only its finalizer
    would close it (and so cancel the engine requests behind it), once the garbage collector breaks the cycle the
    exception's traceback makes: until then the engine goes on generating for nobody, up to max_tokens."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


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
