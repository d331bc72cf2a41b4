"""A request no replica can serve is an HTTP 503 the client can retry, never a 500."""

from __future__ import annotations

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from radixcache.runtime.server.errors import ENGINE_ERRORS, api_error_for


def test_replica_unavailable_is_a_503_with_retry_after() -> None:
    error = api_error_for(ReplicaUnavailableError("no live engine replica can take the request"))
    assert error.status == 503 and error.code == "replica_unavailable"
    assert error.headers == {"Retry-After": "1"}
    assert isinstance(ReplicaUnavailableError("x"), ENGINE_ERRORS)


def _errors() -> list[BaseException]:
    from radixcache.errors import CacheFullError
    from radixcache.runtime.engine.errors import (
        EngineClosedError,
        EngineDeadError,
        QueueFullError,
        QueueTimeoutError,
        RequestTooLargeError,
        SamplingError,
    )
    from radixcache.runtime.grammar.errors import GrammarError
    from radixcache.runtime.tools.errors import ToolInputError

    return [
        QueueFullError("12 requests wait", retry_after=5.0),
        QueueTimeoutError("waited 2 s", retry_after=2.0),
        RequestTooLargeError("prompt of 9000 tokens"),
        CacheFullError("no page to evict"),
        EngineClosedError("this engine is closed"),
        SamplingError("logits went NaN"),
        EngineDeadError(RuntimeError("a bug in the loop")),
        GrammarError("unsupported type 'date'", path="response_format.json_schema.schema.properties.age"),
        ToolInputError("tools[1].function.name", "must be 1 to 64 letters"),
    ]


def test_what_a_replica_raises_reaches_the_front_door_as_itself() -> None:
    """Regression: Ray pickles a replica's errors to the front door. EngineDeadError and ToolInputError could not be
    rebuilt from their message (Ray's UnserializableException: a 500), and GrammarError was rebuilt with its path
    prefixed twice ("response_format: response_format.json_schema...: ..."), which the 400 showed the client."""
    import pickle

    for error in _errors():
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
        same = {k: v for k, v in vars(error).items() if not isinstance(v, BaseException)}
        assert {k: v for k, v in vars(back).items() if not isinstance(v, BaseException)} == same
        assert api_error_for(back).status == api_error_for(error).status
