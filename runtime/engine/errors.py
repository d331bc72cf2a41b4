"""Why the engine refused or dropped a request: errors a caller can act on (a server maps them to HTTP codes).

- RequestTooLargeError: the prompt can never fit the KV pool (a client error; retrying cannot help).
- ContextLengthError (a ValueError): the prompt reaches the model's context, `max_position` (an agent cuts its
  history and sends it again; retrying as it is cannot help).
- EngineOverloadedError: the engine is busy now; `retry_after` says when trying again may succeed.
  - QueueFullError: `max_queue` requests already wait for admission.
  - QueueTimeoutError: the request waited `queue_timeout` seconds without being admitted.
- SamplingError (a ValueError): one request's logits or probabilities went non-finite; it fails alone.
- EngineDeadError: the engine's loop thread died (a bug); every later call raises it, naming the original error.
  EngineStalledError, one: a liveness check found the loop stuck in a step with work to do.
"""

from __future__ import annotations

from radixcache.errors import CacheFullError


class RequestTooLargeError(CacheFullError):
    """A request that can never fit: its prompt needs more pages than the whole KV pool."""


class ContextLengthError(ValueError):
    """A prompt that leaves no room under the model's context: `size` its length in `unit` ("tokens", or "bytes" of
    a text refused before it was tokenised: runtime.loading.prompt_bound), `limit` the context (`max_position`). A
    ValueError, as it always was, that an agent loop can tell from the others to cut its history."""

    def __init__(self, message: str, size: int, limit: int, unit: str = "tokens") -> None:
        super().__init__(message)
        self.size, self.limit, self.unit = size, limit, unit

    def named(self, what: str) -> ContextLengthError:
        """The same error for one prompt of several (`prompts[1]: ...`)."""
        return ContextLengthError(f"{what}: {self}", self.size, self.limit, self.unit)


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


class SamplingError(ValueError):
    """One request's logits or probabilities went non-finite (NaN, +inf, or nothing left to sample from): that
    request fails with it, alone; the other requests of the same step go on."""


class EngineDeadError(RuntimeError):
    """The engine's loop thread died of an error it could not contain (a bug). Requests in flight fail with this
    error, and so does every later call; `cause` is the original error (also `__cause__`)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the engine loop thread died: {type(cause).__name__}: {cause}; this engine serves no more")
        self.cause = cause
        self.__cause__ = cause

    def __reduce__(self) -> tuple[type[EngineDeadError], tuple[BaseException]]:
        # Rebuilt from its cause: the default rebuilt it from its message, a str for `cause`, and failed, so Ray could
        # not send it from a replica (the front door got an UnserializableException, a 500).
        return type(self), (self.cause,)


class EngineStalledError(EngineDeadError):
    """The engine's loop thread has work and has made no progress for longer than a liveness check allows (a step
    that never returns): `Engine.check_alive(stall_s)`. A replica's check raises it, so the front door ends that
    replica for Ray to restart, as for a dead loop; `cause` is a TimeoutError saying how long."""

    def __init__(self, cause: BaseException) -> None:
        RuntimeError.__init__(self, f"the engine loop is stuck: {cause}")
        self.cause = cause
        self.__cause__ = cause
