"""Why the engine refused or dropped a request: errors a caller can act on (a server maps them to HTTP codes).

- RequestTooLargeError: the prompt can never fit the KV pool (a client error; retrying cannot help).
- EngineOverloadedError: the engine is busy now; `retry_after` says when trying again may succeed.
  - QueueFullError: `max_queue` requests already wait for admission.
  - QueueTimeoutError: the request waited `queue_timeout` seconds without being admitted.
"""

from __future__ import annotations

from radixcache.errors import CacheFullError


class RequestTooLargeError(CacheFullError):
    """A request that can never fit: its prompt needs more pages than the whole KV pool."""


class EngineOverloadedError(RuntimeError):
    """The engine cannot take the request now; it held nothing. `retry_after`: a hint, in seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFullError(EngineOverloadedError):
    """Refused at submission: the admission queue is at its limit."""


class QueueTimeoutError(EngineOverloadedError):
    """Dropped from the queue: it waited its whole queue timeout without being admitted."""


class ReplicaUnavailableError(EngineOverloadedError):
    """Behind replicas (runtime.cluster): no live replica could take the request, or the one serving it died after
    its first token (it cannot be retried then). `retry_after`: a hint, in seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message, retry_after)


class EngineClosedError(RuntimeError):
    """The engine was closed (`Engine.close()`): it takes no new requests."""
