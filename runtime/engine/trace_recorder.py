"""Recording what an engine served as a Mooncake-format hash trace (`--record-trace FILE`; docs/traces.md).

One JSONL line per request the engine admitted and that left without an error:

    {"timestamp": ms, "input_length": L, "output_length": O, "hash_ids": [...], "block_size": P,
     "output_hash_ids": [...], "session_id": "...", "finish_timestamp": ms, "retain_for": s}

`timestamp` is the request's arrival, in milliseconds since the recorder was made, and `finish_timestamp` when it
left the engine (never before its `timestamp`): the simulator finishes a recorded request at that time, so requests
that ran side by side here run side by side there. `hash_ids` holds one id per page
of the prompt (pages of the engine's page size P, the last partial page included, as Mooncake does), and
`output_hash_ids` one per whole page the engine computed past the prompt's whole pages (the prompt's tail and the
generated tokens, up to the last token whose KV exists): the pages its tree then holds, which a next turn reads. Each
id is the request's chained page hash (radixcache.page_hash: a page's hash covers every page before it, the model's
fingerprint and the namespace), its first 8 bytes masked to 63 bits. No text and no token id is ever written.
`session_id` is the request's `session`, and `retain_for` its lease hint in seconds (runtime.kv.leases), each
written only when the request gave one, so recorded agent traffic keeps its leases.

A line is written when its request leaves, and lines come out in arrival order: a request that finishes while one
that arrived before it still runs waits (in memory) until that one has left too, so the file is sorted by timestamp
and `radixcache simulate` streams it. A request that reached the engine a moment before one that arrived earlier
(two threads racing to submit) gets the timestamp of the line before it, so the order holds. Each line goes to the
file in one write as it is released (no buffering): a killed process leaves whole lines.

Recording never breaks serving: the first write that fails (disk full, read-only) logs one warning on the
"radixcache.record" logger and stops the recording; the requests go on.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from radixcache.page_hash import PageHasher, chain_hashes

if TYPE_CHECKING:
    from radixcache.runtime.engine.request import Request

log = logging.getLogger("radixcache.record")

_ID_MASK = (1 << 63) - 1


def hash_id(page_hash: bytes) -> int:
    """A page hash as a trace id: its first 8 bytes, big-endian, masked to a non-negative int64."""
    return int.from_bytes(page_hash[:8], "big") & _ID_MASK


def page_ids(
    tokens: Sequence[int], prompt_len: int, kv_len: int, page_size: int, root: bytes
) -> tuple[list[int], list[int]]:
    """(hash_ids, output_hash_ids) of a request whose `tokens` are its prompt (`prompt_len`) and its output, of
    which the first `kv_len` positions have KV: one id per prompt page (a partial last page hashed over its own
    tokens), then one per whole page of the first `kv_len` tokens past the prompt's whole pages."""
    p = page_size
    whole = prompt_len // p
    pages = max(whole, kv_len // p)
    full = chain_hashes(tokens[: pages * p], p, root)
    prompt = full[:whole]
    tail = prompt_len - whole * p
    if tail:
        parent = full[whole - 1] if whole else root
        prompt = [*prompt, *chain_hashes(tokens[whole * p : prompt_len], tail, parent)]
    return [hash_id(h) for h in prompt], [hash_id(h) for h in full[whole:]]


class TraceRecorder:
    """Writes each request an engine served to `path` as one Mooncake JSONL line (see the module docstring).

    `page_size` and `fingerprint` are the engine's (`Engine.record_trace` attaches one). The engine loop calls
    `left` with the requests that just left; `close` writes what is still held and closes the file. Thread-safe.
    Opening the file may raise OSError (a bad path fails at once); nothing after that raises.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        page_size: int,
        fingerprint: str = "",
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.path = os.fspath(path)
        self.page_size = page_size
        self.hasher = PageHasher(fingerprint, page_size)
        self._clock = clock
        self.t0 = clock()
        self.written = 0  # lines written
        self.dropped = 0  # requests not written because the recording stopped
        self.stopped: str | None = None  # why the recording stopped before its close (a write error), else None
        self._file: Any = open(self.path, "wb", buffering=0)  # noqa: SIM115  # one write per line, straight to the OS
        self._held: list[tuple[float, int, dict[str, Any]]] = []  # (arrival, order, line less its timestamp)
        self._order = itertools.count()
        self._last_ms = 0
        self._lock = threading.Lock()
        # Called once the first line is in the file (on the engine loop's thread; `serve --record-trace` moves its
        # staging file onto FILE then: cli.record.StagedRecording). What it raises stops the recording, with a warning.
        self.on_first_line: Callable[[], object] | None = None

    @property
    def recording(self) -> bool:
        """False once closed, or stopped by a write error."""
        return self._file is not None

    def left(self, requests: Iterable[Request], pending_since: float | None) -> None:
        """Requests that just left the engine (on its loop thread). `pending_since`: the earliest arrival among the
        requests still in the engine (None: none), before which every line can be written."""
        with self._lock:
            try:
                left_ms = int((self._clock() - self.t0) * 1000)
                for req in requests:
                    if req.t_admitted is None or req.error is not None:
                        continue  # never admitted (cancelled or timed out in the queue), or failed: nothing served
                    if self._file is None:
                        self.dropped += 1
                        continue
                    line = self._line(req)
                    line["finish_timestamp"] = left_ms
                    heapq.heappush(self._held, (req.t_arrival, next(self._order), line))
                self._release(pending_since)
            except Exception as exc:  # a bug here must never reach the engine loop
                self._stop(f"{type(exc).__name__}: {exc}")

    def writes_to(self, path: str | os.PathLike[str]) -> bool:
        """Whether this recording's open file is the file at `path` (a link or another spelling of it included)."""
        with self._lock:
            if self._file is None:
                return False
            try:
                mine, theirs = os.fstat(self._file.fileno()), os.stat(path)
            except OSError:  # no file there (yet): not ours
                return False
            return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)

    def close(self) -> None:
        """Write every held line and close the file (calling it again does nothing)."""
        with self._lock:
            self._release(None)
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None

    # ------------------------------------------------------------------ private

    def _line(self, req: Request) -> dict[str, Any]:
        prompt_len = len(req.prompt_ids)
        tokens = req.prompt_ids + req.output_ids
        root = self.hasher.root(req.namespace)
        hash_ids, output_ids = page_ids(tokens, prompt_len, min(req.kv.num_kv, len(tokens)), self.page_size, root)
        line: dict[str, Any] = {
            "input_length": prompt_len,
            "output_length": len(req.output_ids),
            "hash_ids": hash_ids,
            "block_size": self.page_size,
            "output_hash_ids": output_ids,
        }
        if req.session is not None:
            line["session_id"] = str(req.session)
        if req.retain_for is not None:
            line["retain_for"] = req.retain_for
        return line

    def _release(self, pending_since: float | None) -> None:
        held = self._held
        while held and (pending_since is None or held[0][0] <= pending_since):
            arrival, _, line = heapq.heappop(held)
            if self._file is None:
                self.dropped += 1
                continue
            ms = max(self._last_ms, int((arrival - self.t0) * 1000))
            line["finish_timestamp"] = max(ms, line["finish_timestamp"])  # a timestamp moved up for order stays first
            self._write(orjson.dumps({"timestamp": ms, **line}) + b"\n")
            self._last_ms = ms

    def _write(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[self._file.write(view) :]
        except OSError as exc:
            self.dropped += 1
            self._stop(exc.strerror or str(exc))
            return
        self.written += 1
        if self.written == 1 and self.on_first_line is not None:
            try:
                self.on_first_line()
            except Exception as exc:  # never into the engine loop, nor out of close
                self._stop(f"{type(exc).__name__}: {exc}")

    def _stop(self, reason: str) -> None:
        """Stop recording for good, with one warning; the lines already written stay."""
        if self._file is None:
            return
        self.stopped = reason
        log.warning("recording to %s stopped: %s", self.path, reason)
        with contextlib.suppress(OSError):
            self._file.close()
        self._file = None


def record_to(loop: Any, path: str | os.PathLike[str] | None, page_size: int, fingerprint: str) -> TraceRecorder | None:
    """Point `loop.recorder` (an engine loop's) at a new recording of `path` (None: none), closing the one it had;
    the new recorder, or None. Opening `path` may raise OSError: the recording under way then goes on, unless it
    writes that very file. That one is closed before the new one truncates the file: closing writes the lines it
    still holds (requests that left while one that arrived before them ran) at its own offset, which in the file
    truncated meanwhile put a run of NUL bytes before them, amid the new recording's lines."""
    previous = loop.recorder
    if previous is not None and path is not None and previous.writes_to(path):
        loop.recorder = None  # a step delivering now finds it closed: it drops the lines, never writes them
        previous.close()
    recorder = TraceRecorder(path, page_size, fingerprint) if path is not None else None
    previous, loop.recorder = loop.recorder, recorder
    if previous is not None:
        previous.close()
    return recorder


def earliest_arrival(queues: Iterable[Iterable[Request]]) -> float | None:
    """The earliest `t_arrival` among the requests of `queues` (None when they are empty)."""
    return min((r.t_arrival for queue in queues for r in queue), default=None)
