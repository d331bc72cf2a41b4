"""What a replica cluster's start checks before and as Ray places its replicas: that a Ray address is reachable
(ray.init retried an address nobody serves for minutes), that a replica's CPU share is a number, that its actor's
threads can all start, that the replicas fit the Ray cluster's CPUs (Ray would queue the ones that do not fit
for ever), and that no replica's process dies while it starts (Ray would restart it for ever)."""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Sequence
from typing import Any

from radixcache.runtime.engine.threads import MAX_THREADS

RAY_CONNECT_TIMEOUT_S = 5.0  # a head node answers a TCP connect in milliseconds; an address nobody serves never
# Ray starts every thread of a threaded actor with it (8 MiB of address space and 2 memory maps each): past what the
# process may map, the actor dies at its start and Ray (max_restarts=-1) starts it again, for ever, silently.
MAX_ACTOR_THREADS = 4096
START_CHECK_S = 1.0  # how often the start looks whether a replica that has not answered yet was restarted
NO_BOUND_S = 10.0**9  # "no bound" as Ray waits: its timeouts are whole milliseconds (infinity was an OverflowError)
STREAMS_WITHOUT_QUEUE_LIMIT = 64  # streams a replica runs at once past max_running when max_queue is unbounded
CONTROL_THREADS = 8  # actor threads beyond the streams (refusals answered at once), and the control group's size
# The actor's concurrency group for every call that is not a request (event pulls, cancels, info, stats, checks): its
# own threads, so a cancel or an event pull never waits in Ray's queue behind streams that wait for a thread.
CONTROL_GROUP = "control"


def check_reachable(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """ConnectionError naming `address` when it is a `host:port` (or `ray://host:port`) that no process accepts a
    connection on: ray.init retried such an address for minutes, printing its own logs, before it failed. "auto",
    "local" and None (a local cluster) are Ray's to resolve; an empty one is a ValueError (Ray's named no argument)."""
    if address is not None and not address.strip():
        raise ValueError("the Ray address is empty: give host:port, ray://host:port or auto (None: a local cluster)")
    match = re.fullmatch(r"(?:ray://)?\[?([^\[\]/]+?)\]?:(\d{1,5})", address or "")
    if match is None:
        return
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def check_cpu_share(cpus: float) -> None:  # before Ray starts
    """ValueError unless `cpus` (a replica's CPU share) is a finite number >= 0."""
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not 0 <= cpus < math.inf:
        raise ValueError(f"cpus (each replica's CPU share) must be a finite number >= 0, got {cpus!r}")


def check_replica_threads(threads: object) -> None:  # before Ray starts
    """ValueError unless `threads` (each replica's torch threads) is an int from 1 to MAX_THREADS: 0, 2.5 or None
    failed in every replica's constructor (torch.set_num_threads), which Ray reports as the actor's death, its text
    a traceback."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(
            f"threads (each replica's torch threads) must be an int from 1 to {MAX_THREADS}, got {threads!r}"
        )


def check_cache_on(engine_kwargs: dict[str, Any] | None) -> None:  # before Ray starts
    """ValueError for `enable_cache=False` among the replicas' engine options: the router routes by what each replica
    caches (its cache events), and every replica failed its start on it (on Ray, each actor's death, a traceback)."""
    if not (engine_kwargs or {}).get("enable_cache", True):
        raise ValueError("engine replicas need their cache (the router routes by it): drop enable_cache=False")


def call_bound(call_timeout: float | None) -> float:
    """The seconds the front door waits for a replica's answer: `call_timeout`, a number > 0; None or infinity is no
    bound (NO_BOUND_S, some 31 years: Ray took infinity, and failed every request with OverflowError). ValueError
    for anything else (NaN, 0, a negative number, a string), before Ray starts."""
    if call_timeout is None or call_timeout == math.inf:
        return NO_BOUND_S
    if isinstance(call_timeout, bool) or not isinstance(call_timeout, (int, float)) or not 0 < call_timeout < math.inf:
        raise ValueError(f"call_timeout must be a number of seconds > 0 (None: no bound), got {call_timeout!r}")
    return float(min(call_timeout, NO_BOUND_S))


def check_poll_interval(poll_interval: float | None) -> None:
    """ValueError unless `poll_interval` is None (the caller polls) or a finite number > 0: NaN, 0 or less polled
    every replica in a busy loop (a wait of NaN seconds returns at once)."""
    if poll_interval is None:
        return
    if (
        isinstance(poll_interval, bool)
        or not isinstance(poll_interval, (int, float))
        or not 0 < poll_interval < math.inf
    ):
        raise ValueError(f"poll_interval must be a finite number of seconds > 0 or None, got {poll_interval!r}")


def node_cpus(ray: Any) -> list[float]:
    """The CPUs of each live node of the Ray cluster `ray` is connected to."""
    return [float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]


def check_cpus(replicas: int, cpus: float, nodes: Sequence[float]) -> None:
    """ValueError when `replicas` actors of `cpus` CPUs each cannot all be placed on a Ray cluster whose nodes have
    `nodes` CPUs: Ray would queue the ones that do not fit for ever, and the start waited on them, silently, for
    ever. An actor runs on one node, so the share must fit the nodes one by one, not only their sum (2 replicas of 2
    CPUs on 4 nodes of 1 CPU waited for ever). Ray counts CPUs in units of 1/10,000, rounding a share down (cores /
    replicas fits the cores exactly)."""
    check_cpu_share(cpus)
    unit = math.floor(cpus * 10_000)
    need, have = replicas * unit / 10_000, sum(nodes)
    if need > have:
        raise ValueError(
            f"{replicas} engine replicas of {cpus:g} CPUs each need {need:g} CPUs, and the Ray cluster has "
            f"{have:g}: give each replica a smaller share (cpus=), or start Ray with more CPUs (num_cpus=)"
        )
    fit = sum(round(n * 10_000) // unit for n in nodes) if unit else replicas
    if fit < replicas:
        shown = ", ".join(f"{n:g}" for n in nodes)
        raise ValueError(
            f"{replicas} engine replicas of {cpus:g} CPUs each: only {fit} fit on the Ray cluster's nodes (of {shown} "
            "CPUs), as a replica runs on one node: give each a smaller share (cpus=; --threads with --ray-address)"
        )


def actor_threads(engine_kwargs: dict[str, Any] | None) -> int:
    """A replica actor's max_concurrency: every request its engine may hold (max_running admitted plus max_queue
    waiting) gets a thread, so each reaches the engine's own admission (a full queue is refused there, 429, and
    queue_timeout counts there) instead of waiting in Ray's queue; plus CONTROL_THREADS, so a request past those is
    refused at once. Calls that are not requests run in the CONTROL_GROUP's own threads (`ReplicaCluster.control`).
    ValueError past MAX_ACTOR_THREADS (Ray starts them all with the actor), or for a bad max_queue."""
    kwargs = engine_kwargs or {}
    scheduler = kwargs.get("scheduler_config")
    running = getattr(scheduler, "max_running", None) or kwargs.get("max_running") or 64
    queue = kwargs.get("max_queue")
    if queue is not None and (type(queue) is not int or queue < 0):  # as the engine's: a negative one made 0 threads
        raise ValueError(f"max_queue must be an int >= 0 or None, got {queue!r}")
    threads = int(running) + (STREAMS_WITHOUT_QUEUE_LIMIT if queue is None else queue) + CONTROL_THREADS
    check_actor_threads(threads, running, queue)
    return threads


def check_actor_threads(threads: int, max_running: int, max_queue: int | None) -> None:
    """ValueError when a replica's actor would need more than MAX_ACTOR_THREADS threads (one per request its engine
    may hold: actor_threads): `--max-queue 40000` restarted every replica for ever (checked
    under a 16 GB address-space limit, 5,000 threads already did)."""
    if threads > MAX_ACTOR_THREADS:
        queue = "unbounded" if max_queue is None else max_queue
        raise ValueError(
            f"each engine replica's Ray actor needs a thread per request its engine may hold ({threads}: max_running "
            f"{max_running}, max_queue {queue} and a few for control calls), at most {MAX_ACTOR_THREADS}: give a "
            "smaller max_queue (--max-queue) or max_running (--max-running)"
        )


def wait_started(ray: Any, actors: dict[int, Any], refs: list[Any]) -> list[Any]:
    """The replicas' answers `refs` (one per actor of `actors`, in order), once all have come. A replica whose process
    died while it started (an OOM kill as it loads the model or allocates its KV memory, a native crash) is a
    RuntimeError naming it: Ray restarts it (max_restarts=-1), each start dies again, and the start waited for ever,
    silently (Ray's messages do not reach the driver). A replica that died for good raises Ray's actor error."""
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=START_CHECK_S)
        for (replica, actor), ref in zip(actors.items(), refs, strict=True):
            restarts = _restarts(actor) if ref in pending else 0
            if restarts:
                raise RuntimeError(
                    f"engine replica {replica}'s process died while it started ({restarts} times, restarted by Ray "
                    "each time): killed for its memory (the model, --kv-memory, a thread per request its engine may "
                    "hold) or by a native crash; see the worker logs of Ray's session (logs/ under its session dir)"
                )
    return [ray.get(ref) for ref in refs]


def _restarts(actor: Any) -> int:
    """How many times Ray has restarted `actor`, from Ray's actor table (0 where it cannot be read)."""
    try:
        from ray._private import state

        return int(state.actors(actor._actor_id.hex())["NumRestarts"])
    except Exception:
        return 0


def seconds_option(name: str, value: float | None, *, none_ok: bool) -> float | None:
    """`value`, a finite number of seconds >= 0 (or None where `none_ok`: no such check); ValueError naming `name`
    for anything else (NaN, infinity, a negative number, a string, a bool), before Ray starts."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(
            f"{name} must be a finite number of seconds >= 0{' or None' if none_ok else ''}, got {value!r}"
        )
    return float(value)
