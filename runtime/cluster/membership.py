"""The front door's routing set and index upkeep (runtime.cluster.cluster.ReplicaCluster, a Membership): a replica
whose call fails with a Ray actor error (or whose engine loop died) leaves the routing set; each replica's event
batches are pulled and applied in order, a gap or a new incarnation resyncs it from a snapshot, and a dead replica
that Ray restarted rejoins with an empty index.

The front door keeps its own record of when it saw each replica die: a sequence number (the deaths seen so far) taken
as the replica leaves the routing set, by whichever call found it dead. A request notes the number before it is sent
(`death_mark`), and a death counts against its re-send limit (runtime.cluster.resend) only when the front door first
saw it after that (`died_since`): no clock of Ray's or of another machine is read (Ray's recorded end time of an actor
can come before the `ray.kill` that ended it), so a request that kills its replica at once is always counted."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixcache.runtime.engine.errors import EngineDeadError

if TYPE_CHECKING:
    from radixcache.router import RouterIndex

log = logging.getLogger("radixcache.cluster")


class Membership:
    """ReplicaCluster's membership and event methods; the state is the cluster's (its `__init__` sets it)."""

    ray: Any
    actor_errors: tuple[type[BaseException], ...]
    router: Any
    index: RouterIndex
    loads: Any
    call_timeout: float
    stall_timeout: float | None  # a replica's engine loop stuck this long with work counts as dead (`check_live`)
    _actors: dict[int, Any]
    _alive: set[int]
    _broken: dict[int, str | None]
    _incarnation: dict[int, str]
    _lock: threading.Lock
    _sync_locks: dict[int, threading.Lock]
    _poll_lock: threading.Lock
    _pulls: dict[int, tuple[tuple[bool, Any], float]]  # replica -> (an outstanding pull, when asked); its lock held
    _deaths: int  # the deaths seen so far: each one's sequence number in `_seen_dead`
    _seen_dead: dict[int, int]  # replica -> the sequence number of the last time the front door saw it die
    control: Callable[[int, str], Any]  # ReplicaCluster.control

    def actor_died(self, replica: int, exc: BaseException) -> bool:
        """Whether `exc` (from `replica`) says it serves no more (it then leaves the routing set): its actor died, or
        its engine loop did (EngineDeadError; that actor is ended for Ray to restart, to rejoin as a new process)."""
        if not isinstance(exc, self.actor_errors):
            if not isinstance(getattr(exc, "cause", exc), EngineDeadError):
                return False
            with self._lock:  # one kill, by the first to see it (a second could end the restarted process)
                first = replica in self._alive and self._broken.get(replica) != self._incarnation.get(replica)
                self._broken[replica] = self._incarnation.get(replica)
            if first:
                self.ray.kill(self._actors[replica], no_restart=False)
        self.mark_dead(replica, exc)
        return True

    def mark_dead(self, replica: int, exc: BaseException) -> None:
        """`replica` failed a call: it leaves the routing set now (index, load and router memory dropped)."""
        with self._lock:
            if replica not in self._alive:
                return
            self._alive.discard(replica)
            self._deaths += 1
            self._seen_dead[replica] = self._deaths
            self.index.remove_replica(replica)
            self.loads.remove_replica(replica)
            forget = getattr(self.router, "forget", None)
            if forget is not None:
                forget(replica)
        log.warning("engine replica %d left the routing set: %s", replica, exc)

    def death_mark(self) -> int:
        """The front door's count of the deaths it has seen, read just before a request is sent to a replica: a death
        of that replica seen later (`died_since`) may be the request's doing; one seen earlier cannot be."""
        with self._lock:
            return self._deaths

    def died_since(self, replica: int, mark: int) -> bool:
        """Whether the front door first saw `replica`'s death (the last one) after `mark` (`death_mark`, read when a
        request was sent to it), so it happened while the request was on it, or could have. True, the safe side,
        for one back in the routing set since (Ray restarted it and it rejoined) or never seen dead."""
        with self._lock:
            seen = self._seen_dead.get(replica)
            return seen is None or replica in self._alive or seen > mark

    def check_live(self, exclude: set[int], wait: float) -> None:
        """Ask every live replica not in `exclude` whether it lives (its `check_alive`, from its control threads; its
        `info` answers from a live process whose engine loop died), all at once, waiting at most `wait` seconds in all:
        one whose actor is dead, or whose engine loop died (EngineDeadError: its actor is ended for Ray to restart, as
        `actor_died` does for a request's; so does one stuck past `stall_timeout`: EngineStalledError), leaves the
        routing set now, before a request that another replica's death made the front door re-send goes to it, so its
        death is seen before the request was sent there and is not counted against it; a request that finds every
        replica dead so is told that none is live. One that does not answer in time, or answers with an error of its
        own, stays (slow is not dead: a request sent to it and failing there counts, the safe side)."""
        ray = self.ray
        deadline = time.monotonic() + max(0.0, min(wait, self.call_timeout))
        with self._lock:
            asked = sorted(self._alive - exclude)
        refs = [(replica, self.control(replica, "check_alive").remote(self.stall_timeout)) for replica in asked]
        for replica, ref in refs:
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (*self.actor_errors, ray.exceptions.RayTaskError) as exc:
                self.actor_died(replica, exc)  # its engine's own error (not a death) leaves it as it was
            except ray.exceptions.GetTimeoutError:
                pass

    def poll(self, wait: float | None = None) -> None:
        """One round: pull every live replica's new event batches; look for dead ones that Ray has restarted. Every
        replica is asked at once and its answer applied as it comes (a resync's snapshot, asked then, likewise); the
        round waits at most `wait` seconds (None: call_timeout) for what it asked. A question not answered by then
        stays outstanding: later rounds neither ask that replica again nor wait for it, and apply its answer in the
        round that finds it in (one outstanding past call_timeout is dropped and asked again). So a frozen, dead or
        restarting replica holds back no other's events, nor the rejoin of restarted ones: each round waited for it
        (the poller 5 s), and the others' new pages reached the index once per that wait. A replica whose sync
        another caller holds now (a request's, on its way out) is left to it this round."""
        bound = self._bound(wait)
        with self._poll_lock:  # one round at a time (the poller's, or a caller's): the outstanding questions are its
            deadline = time.monotonic() + bound
            fresh = set()
            for replica in self._actors:
                lock = self._sync_locks[replica]
                if replica in self._pulls or not lock.acquire(blocking=False):
                    continue
                try:
                    self._pulls[replica] = (self._ask(replica), time.monotonic())
                except BaseException:
                    lock.release()
                    raise
                fresh.add(replica)
            try:  # answers applied as they come, each replica's lock let go at once (a request's sync waits for it)
                while self._pulls:
                    waiting = fresh.intersection(self._pulls)
                    left = max(0.0, deadline - time.monotonic()) if waiting else 0.0  # outstanding: not waited for
                    ready, _ = self.ray.wait([p[0][1] for p in self._pulls.values()], timeout=left)
                    if not ready:
                        break
                    for replica in [r for r, p in self._pulls.items() if any(p[0][1] is x for x in ready)]:
                        (alive, ref), _ = self._pulls.pop(replica)
                        snapshot = None
                        try:
                            if alive is None:
                                self._resynced(replica, ref, 0.0)
                            elif self._answer(replica, (alive, ref), 0.0):
                                snapshot = self.control(replica, "snapshot").remote()
                                self._pulls[replica] = ((None, snapshot), time.monotonic())
                                fresh.add(replica)
                        finally:
                            if snapshot is None:
                                self._sync_locks[replica].release()
            finally:
                stale = time.monotonic() - self.call_timeout
                for replica in [r for r, p in self._pulls.items() if p[1] < stale]:
                    del self._pulls[replica]  # as a timed-out pull: the index stays as it was, the next round asks
                    self._sync_locks[replica].release()

    def sync(self, replica: int, wait: float | None = None) -> None:
        """Bring `replica`'s index up to date now (its new batches, or a resync), or see whether a dead replica is
        back, waiting at most `wait` seconds in all (None: call_timeout). One caller per replica at a time (a
        per-replica lock), so batches are applied once, in order; one that cannot take the lock within `wait`
        (others' syncs of a frozen replica hold it, each in turn, or the poller's outstanding question) leaves the
        sync to them and the poller."""
        wait = self._bound(wait)
        deadline = time.monotonic() + wait
        lock = self._sync_locks[replica]
        if not lock.acquire(timeout=wait):
            return
        try:
            if self._answer(replica, self._ask(replica), max(0.0, deadline - time.monotonic())):
                snapshot = self.control(replica, "snapshot").remote()
                self._resynced(replica, snapshot, max(0.0, deadline - time.monotonic()))
        finally:
            lock.release()

    def _bound(self, wait: float | None) -> float:
        return self.call_timeout if wait is None else min(wait, self.call_timeout)

    def _ask(self, replica: int) -> tuple[bool, Any]:
        """Send `replica` the sync's question (its sync lock held): its batches after the index's last, or, for a
        dead replica, its info (whether Ray has restarted it). (alive, the answer's ref)."""
        with self._lock:
            alive = replica in self._alive
            last = self.index.last_seq(replica) if alive else 0
        if alive:
            return True, self.control(replica, "events_since").remote(last)
        return False, self.control(replica, "info").remote()

    def _answer(self, replica: int, ask: tuple[bool, Any], wait: float) -> bool:
        """Apply `replica`'s answer to `_ask`, awaited at most `wait` seconds (a dead replica's: at most 1 s). True
        when the replica must be resynced from a snapshot (a gap, or a new incarnation), which the caller asks."""
        alive, ref = ask
        ray = self.ray
        try:
            if not alive:
                info = ray.get(ref, timeout=min(wait, 1.0))
                if info["incarnation"] != self._broken.get(replica):  # not the process whose engine died
                    self._rejoin(replica, info["incarnation"])
                return False
            incarnation, batches = ray.get(ref, timeout=wait)
        except self.actor_errors as exc:
            self.mark_dead(replica, exc)
            return False
        except ray.exceptions.GetTimeoutError:
            return False
        if incarnation == self._incarnation.get(replica) and batches is not None:
            with self._lock:
                if replica not in self._alive or all(self.index.apply(b) for b in batches):
                    return False
        return True

    def _rejoin(self, replica: int, incarnation: str) -> None:
        """A restarted replica joins again with an empty index (its cache is empty; its events start from 1)."""
        with self._lock:
            self._incarnation[replica] = incarnation
            if replica in self.index:
                self.index.remove_replica(replica)
            self.index.add_replica(replica)
            self._alive.add(replica)
        log.warning("engine replica %d is back (restarted by Ray)", replica)

    def _resynced(self, replica: int, snapshot: Any, wait: float) -> None:
        """Replace `replica`'s index by its `snapshot` call's answer, awaited at most `wait` seconds."""
        ray = self.ray
        try:
            incarnation, seq, keys = ray.get(snapshot, timeout=wait)
        except self.actor_errors as exc:
            self.mark_dead(replica, exc)
            return
        except ray.exceptions.GetTimeoutError:  # as an event pull's: the index stays as it was, the next sync retries
            return
        with self._lock:
            if replica not in self._alive:
                return
            self._incarnation[replica] = incarnation
            self.index.resync(replica, seq, keys)
