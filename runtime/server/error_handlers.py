"""Every refusal and failure of the app as OpenAI's error JSON (runtime.server.protocol.APIError), counted in
/metrics by status: the app's own APIErrors, pydantic's validation errors (a 400 naming the field), Starlette's
refusals (a body that is not JSON, gzip: 415, an unknown path, a wrong method), the engine's errors (429 / 503 with
Retry-After, 400 context_length_exceeded: runtime.server.errors) and anything else as a 500 (a bug). With API keys,
a /v1 request without one is refused (401) before its body is read."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixcache.runtime.engine.errors import EngineOverloadedError
from radixcache.runtime.engine.protocol import GenerationEngine
from radixcache.runtime.server.errors import ENGINE_ERRORS, api_error_for
from radixcache.runtime.server.http_common import KeysFirst
from radixcache.runtime.server.metrics import ServerMetrics
from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.server.validation_errors import body_message, refusal, validation_message


def add_error_handlers(app: FastAPI, engine: GenerationEngine, metrics: ServerMetrics, keys: frozenset[str]) -> None:
    """`app`'s exception handlers, and KeysFirst when there are `keys` (added after the app's other middleware, so
    that it runs first: outside BodyLimit, an unauthenticated request's body is never read)."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        metrics.failed(exc.status)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    if keys:  # outside BodyLimit: an unauthenticated /v1 request is refused before its body is read
        app.add_middleware(KeysFirst, refuse=_api_error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        whole = body_message(errors[0], request.headers.get("content-type")) if errors else None
        message, param = (whole, None) if whole is not None else validation_message(errors)
        return await _api_error(request, APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own refusals in OpenAI's shape too: a body FastAPI cannot decode (invalid UTF-8, an integer
        past Python's digit limit, nesting past the JSON decoder's, gzip: 415), an unknown path, a wrong method."""
        status, message = refusal(exc.status_code, str(exc.detail), request.headers.get("content-encoding"))
        return await _api_error(request, APIError(status, message, headers=dict(exc.headers or {})))

    async def _engine_error(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, EngineOverloadedError):  # the hint is at least the queue's recent admission wait
            estimate = getattr(getattr(engine, "queue", None), "retry_after", None)
            if callable(estimate):
                exc.retry_after = max(exc.retry_after, estimate())
        return await _api_error(_, api_error_for(exc))

    for kind in ENGINE_ERRORS:  # errors a client or the load can cause: a status, no traceback in the log
        app.add_exception_handler(kind, _engine_error)
    app.add_exception_handler(Exception, _engine_error)  # anything else is a bug: a 500 (and a traceback)
