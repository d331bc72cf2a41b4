"""What each engine error means over HTTP. A 500 means a bug in this server; everything a client or the load can
cause has its own status:

| engine error | status | OpenAI type / code |
|---|---|---|
| RequestTooLargeError (a prompt the pool can never hold) | 400 | invalid_request_error / context_length_exceeded |
| ContextLengthError (a prompt past the model's context) | 400 | invalid_request_error / context_length_exceeded |
| GrammarError, ToolInputError (a bad schema, grammar, tool, message) | 400, `param` its path | invalid_request_error |
| ValueError (a value the engine refuses) | 400 | invalid_request_error |
| QueueFullError (`--max-queue` requests already wait) | 429 + Retry-After | rate_limit_error / queue_full |
| QueueTimeoutError (not admitted within `--queue-timeout`) | 503 + Retry-After | server_error / queue_timeout |
| CacheFullError (no room beside pinned pages, for now) | 503 + Retry-After | server_error / kv_cache_full |
| EngineClosedError (the server is shutting down) | 503 | server_error / shutting_down |
| ReplicaUnavailableError (`--replicas`: none alive, died mid-stream, mute) | 503 + Retry-After | replica_unavailable |
| EngineDeadError (the engine's loop thread died of a bug; it serves no more) | 503 | server_error / engine_dead |
| anything else | 500 | server_error |

An EngineDeadError is a bug too, but not this request's: every later request (and /health/cache) gets the same 503,
without Retry-After since retrying this process cannot help, until the server is restarted.
"""

from __future__ import annotations

import math

from radixcache.errors import CacheFullError
from radixcache.runtime.engine.errors import (
    ContextLengthError,
    EngineClosedError,
    EngineDeadError,
    EngineOverloadedError,
    QueueFullError,
    ReplicaUnavailableError,
    RequestTooLargeError,
)
from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.server.structured import bad_request
from radixcache.runtime.tools.errors import ToolInputError

ENGINE_ERRORS = (
    RequestTooLargeError,
    EngineOverloadedError,
    EngineClosedError,
    EngineDeadError,
    CacheFullError,
    ValueError,
)


def _retry(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def api_error_for(exc: BaseException) -> APIError:
    """The HTTP error for an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, (RequestTooLargeError, ContextLengthError)):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, QueueFullError):
        return APIError(429, str(exc), type="rate_limit_error", code="queue_full", headers=_retry(exc.retry_after))
    if isinstance(exc, ReplicaUnavailableError):
        return APIError(503, str(exc), type="server_error", code="replica_unavailable", headers=_retry(exc.retry_after))
    if isinstance(exc, EngineOverloadedError):
        return APIError(503, str(exc), type="server_error", code="queue_timeout", headers=_retry(exc.retry_after))
    if isinstance(exc, EngineClosedError):
        return APIError(503, str(exc), type="server_error", code="shutting_down")
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), type="server_error", code="engine_dead")
    if isinstance(exc, CacheFullError):
        return APIError(503, str(exc), type="server_error", code="kv_cache_full", headers=_retry(1.0))
    if isinstance(exc, (GrammarError, ToolInputError)):
        return bad_request(exc)
    if isinstance(exc, ValueError):
        return APIError(400, str(exc))
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
