"""A request no replica can serve is an HTTP 503 the client can retry, never a 500."""

from __future__ import annotations

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from radixcache.runtime.server.errors import ENGINE_ERRORS, api_error_for


def test_replica_unavailable_is_a_503_with_retry_after() -> None:
    error = api_error_for(ReplicaUnavailableError("no live engine replica can take the request"))
    assert error.status == 503 and error.code == "replica_unavailable"
    assert error.headers == {"Retry-After": "1"}
    assert isinstance(ReplicaUnavailableError("x"), ENGINE_ERRORS)
