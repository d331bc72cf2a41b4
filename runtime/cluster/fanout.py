"""The front door's control calls to every replica (runtime.cluster.cluster.ReplicaCluster.each): stats, unpin and
the like, each answer under the replica that gave it.

Every replica is asked at once and all answers are awaited within one bound: asked one after another, N frozen
replicas (alive, answering nothing) held the caller N x call_timeout. A read (`stats`, for /metrics) waits at most
READ_WAIT_S: a live replica answers it at once (from its control threads), and a frozen one held each scrape for
call_timeout (600 s); past the bound the replicas that have not answered are named in a ReplicaUnavailableError.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from radixcache.runtime.engine.errors import ReplicaUnavailableError


class ReplicaCluster(Protocol):
    """What the fan-out and runtime.cluster.stream_wait read of runtime.cluster.cluster.ReplicaCluster (which imports
    both: named by a protocol, not imported, so that they make no cycle)."""

    ray: Any
    call_timeout: float
    alive: Any
    actor_errors: tuple[type[BaseException], ...]

    def control(self, replica: int, method: str) -> Any: ...

    def actor_died(self, replica: int, exc: BaseException) -> bool: ...


READ_WAIT_S = 10.0  # the most a read of every replica's stats waits (Prometheus's scrape timeout is 10 s by default)


def read_wait(cluster: ReplicaCluster) -> float:
    """The bound of a read of every replica (`stats`, `counted_stats`): READ_WAIT_S, or call_timeout if shorter."""
    return min(READ_WAIT_S, cluster.call_timeout)


def ask_each(cluster: ReplicaCluster, method: str, *args: Any, wait: float | None = None) -> dict[int, Any]:
    """`method(*args)` on every live replica at once, each answer under the replica that gave it (in replica order):
    a replica dropped on the way leaves no gap that would shift the others' answers onto its id. A replica whose
    engine died is dropped (`actor_died`) as a request would find it: an idle one would draw none to find it, and
    fail every call. All answers are awaited within `wait` seconds in all (None: call_timeout); the replicas that
    have not answered by then are a ReplicaUnavailableError (503: alive but not answering, as a request's)."""
    ray = cluster.ray
    bound = cluster.call_timeout if wait is None else wait
    deadline = time.monotonic() + bound
    refs = [(replica, cluster.control(replica, method).remote(*args)) for replica in cluster.alive]
    out, silent = {}, []
    for replica, ref in refs:
        try:
            out[replica] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except (*cluster.actor_errors, ray.exceptions.RayTaskError) as exc:
            if not cluster.actor_died(replica, exc):  # its engine's own error: the caller's to see
                raise
        except ray.exceptions.GetTimeoutError:
            silent.append(replica)
    if silent:
        names = ", ".join(map(str, silent))
        raise ReplicaUnavailableError(f"engine replica {names} did not answer {method} within {bound} s")
    return out
