"""The front door's re-send rule: how often a request is re-sent after a replica died under it (docs/replicas.md).

Every death counts, whether or not the replica had admitted the request: a request that crashes its replica in its
first prefill step (a native crash, an OOM kill) ends the process before the replica's report of its admission can
leave it, so the front door cannot tell it from the requests that waited beside it. One re-send lets those through
another replica; a second death fails the request, so a poison request takes down two replicas, not each in turn.
"""

from __future__ import annotations

import logging

from radixcache.runtime.engine.errors import ReplicaUnavailableError

RESENDS_AFTER_DEATH = 1
log = logging.getLogger("radixcache.cluster")


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
