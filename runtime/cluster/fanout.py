"""The front door's control calls to every replica (runtime.cluster.cluster.ReplicaCluster.each): stats, unpin and
the like, each answer under the replica that gave it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixcache.runtime.engine.errors import ReplicaUnavailableError

if TYPE_CHECKING:
    from radixcache.runtime.cluster.cluster import ReplicaCluster


def ask_each(cluster: ReplicaCluster, method: str, *args: Any) -> dict[int, Any]:
    """`method(*args)` on every live replica, each answer under the replica that gave it (in replica order): a
    replica dropped on the way leaves no gap that would shift the others' answers onto its id. A replica whose engine
    died is dropped (`actor_died`) as a request would find it: an idle one would draw none to find it, and fail every
    call."""
    ray = cluster.ray
    out = {}
    for replica in cluster.alive:
        try:
            ref = cluster.control(replica, method).remote(*args)
            out[replica] = ray.get(ref, timeout=cluster.call_timeout)
        except (*cluster.actor_errors, ray.exceptions.RayTaskError) as exc:
            if not cluster.actor_died(replica, exc):  # its engine's own error: the caller's to see
                raise
        except ray.exceptions.GetTimeoutError:  # alive but not answering: a 503 (as a request), not a 500
            raise ReplicaUnavailableError(
                f"engine replica {replica} did not answer {method} within {cluster.call_timeout} s"
            ) from None
    return out
