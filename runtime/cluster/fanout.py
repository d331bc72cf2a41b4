"""The front door's control calls to every replica (runtime.cluster.cluster.ReplicaCluster.each): stats, unpin and
the like, each answer under the replica that gave it.

Every replica is asked at once and all answers are awaited within one bound: asked one after another, N frozen
replicas (alive, answering nothing) held the caller N x call_timeout. A read (`stats`, for /metrics) waits at most
READ_WAIT_S: a live replica answers it at once (from its control threads), and a frozen one held each scrape for
call_timeout (600 s); past the bound the replicas that have not answered are named in a ReplicaUnavailableError, or,
for /metrics (`gather`), reported down beside the others' answers.
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


# The most a read of every replica's stats waits: under Prometheus's default scrape timeout (10 s), so a scrape with a
# frozen replica still gets its answer, the others' figures (runtime.cluster.front_calls.ReplicaCalls.stats).
READ_WAIT_S = 5.0


def read_wait(cluster: ReplicaCluster) -> float:
    """The bound of a read of every replica (`stats`, `counted_stats`): READ_WAIT_S, or call_timeout if shorter."""
    return min(READ_WAIT_S, cluster.call_timeout)


def ask_each(cluster: ReplicaCluster, method: str, *args: Any, wait: float | None = None) -> dict[int, Any]:
    """`method(*args)` on every live replica at once, each answer under the replica that gave it (in replica order):
    a replica dropped on the way leaves no gap that would shift the others' answers onto its id. A replica whose
    engine died is dropped (`actor_died`) as a request would find it: an idle one would draw none to find it, and
    fail every call. All answers are awaited within `wait` seconds in all (None: call_timeout); the replicas that
    have not answered by then are a ReplicaUnavailableError (503: alive but not answering, as a request's)."""
    out, silent = gather(cluster, method, *args, wait=wait)
    if silent:
        raise silent_error(cluster, silent, method, wait)
    return out


def gather(
    cluster: ReplicaCluster, method: str, *args: Any, wait: float | None = None
) -> tuple[dict[int, Any], list[int]]:
    """`ask_each`'s answers, and the live replicas that had not answered within `wait` (None: call_timeout), instead
    of its error: a read that goes on without them (/metrics shows them down, with the others' figures)."""
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
                raise engine_error(exc) from None
        except ray.exceptions.GetTimeoutError:
            silent.append(replica)
    return out, silent


def engine_error(exc: BaseException) -> BaseException:
    """The replica engine's own exception in Ray's wrapper of it (RayTaskError, whose text is a remote traceback with
    terminal colour codes), as ReplicaCluster.generate and ClusterEngine raise it; `exc` itself when it wraps none."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


def silent_error(
    cluster: ReplicaCluster, silent: list[int], method: str, wait: float | None
) -> ReplicaUnavailableError:
    """The 503 that names the replicas that did not answer `method` within `wait` (None: call_timeout)."""
    bound = cluster.call_timeout if wait is None else wait
    return ReplicaUnavailableError(
        f"engine replica {', '.join(map(str, silent))} did not answer {method} within {bound} s"
    )
