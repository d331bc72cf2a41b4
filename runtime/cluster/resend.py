"""The front door's re-send rule: how often a request is re-sent after a replica died under it (docs/replicas.md).

Every death counts, whether or not the replica had admitted the request: a request that crashes its replica in its
first prefill step (a native crash, an OOM kill) ends the process before the replica's report of its admission can
leave it, so the front door cannot tell it from the requests that waited beside it. One re-send lets those through
another replica; a second death fails the request, so a poison request takes down two replicas, not each in turn.

Only deaths that the front door first saw after the request was sent to that replica count (its own record, a sequence
number: runtime.cluster.membership): one seen before did not happen under the request. Before a re-send the front door
asks the other live replicas whether they live (`Membership.check_live`, at most the cluster's `live_check_s`; one whose
engine loop is stuck past its `stall_timeout` is dead too): those found dead leave the routing set before the request
could go to them, so a request that arrives after every replica died fails on the first one it finds dead and is then
told that no live replica can take it, not that it may be what kills them. A request's own kill of a replica is seen
after it was sent, on the front door's side alone, so a poison request is always counted and stopped.
"""

from __future__ import annotations

import logging
from typing import Any

from radixcache.runtime.engine.errors import ReplicaUnavailableError

RESENDS_AFTER_DEATH = 1
# The most a re-send waits for the other replicas to say whether they live (Membership.check_live): a live one answers
# at once from its control threads, a dead one fails at once; a frozen one is not waited for past this.
LIVE_CHECK_S = 1.0  # the default of ReplicaCluster's `live_check_s`
# The default of ReplicaCluster's `stall_timeout`: a replica whose engine loop has had work and made no progress for
# this long (a step that never returns) is found dead by that check; far above any sound step (a prefill chunk).
STALL_TIMEOUT_S = 120.0
log = logging.getLogger("radixcache.cluster")


def after_death(cluster: Any, tried: set[int], died: set[int], replica: int, mark: int, exc: BaseException) -> None:
    """`replica`, which a request was sent to with the front door's death count at `mark` (`death_mark`), died (`exc`,
    its error): it is never offered the request again (`tried`); its death counts against the request (`died`) when
    the front door first saw it after `mark`; past the limit, `check_resend`'s 503. Else the replicas left are asked
    whether they live (`check_live`): those found dead leave the routing set before the re-send, not counted."""
    tried.add(replica)
    if cluster.died_since(replica, mark):
        died.add(replica)
    check_resend(died, exc)
    cluster.check_live(tried, cluster.live_check_s)


def check_resend(died: set[int], exc: BaseException) -> None:
    """ReplicaUnavailableError (503) when a request under which the replicas `died` died may not be re-sent again
    (more than RESENDS_AFTER_DEATH deaths): it may be what kills them. `exc`, the last death's error, goes to the
    log; into the message only as an engine's own error (`engine_reason`). A replica that died under a request is
    never offered it again, restarted or not (the dispatch's `tried`): its one re-send goes to a replica that never
    ran it."""
    if len(died) > RESENDS_AFTER_DEATH:
        names = ", ".join(map(str, sorted(died)))
        log.warning("engine replicas %s died under one request; the last: %s", names, exc)  # Ray's text: the log's
        reason = engine_reason(exc)
        raise ReplicaUnavailableError(
            f"engine replicas {names} died while serving this request; it is not re-sent again, as it may be what "
            f"kills them{f' (the last{reason})' if reason else ''}"
        )


def engine_reason(exc: BaseException) -> str:
    """`: <the engine's own error>` when `exc` is Ray's wrapper of one (its loop thread died: EngineDeadError), which
    the client may read; an empty string for Ray's own error of a process gone, whose text (actor id, node, RPC
    codes) is the log's."""
    cause = getattr(exc, "cause", None)
    return f": {cause}" if isinstance(cause, Exception) else ""
