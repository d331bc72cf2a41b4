"""Threads that yield: the engine loop's torch thread count follows the cores the engine actually gets.

Why: torch (and the native kernels, runtime.native) run each parallel kernel on an OpenMP team whose threads meet at
a barrier after every kernel. On a machine where other programs want the cores too, the scheduler deschedules one
of the team now and then, and every other member waits at the next barrier for it: with one busy single-thread
process beside a 2-thread engine on 2 cores, gguf decode ran at 27% of its idle speed where a 1-thread engine kept
101% (docs/benchmarks.md, "Beside busy single-thread processes", run A).

What: `ThreadController` measures windows of back-to-back engine steps (`window_s` at least, between steps only):
- waiting: how many of this process's threads were, on average, ready to run but waiting for a core (Linux's
  per-thread run-queue delay, /proc/self/task/*/schedstat). A 2-thread engine beside one busy process on 2 cores
  waits 0.75 threads; on an idle machine 0.01.
- idle: how many of the cores this process may run on (its affinity) were, on average, idle (/proc/stat); under
  a cgroup CPU quota at most the quota's CPUs less what its cgroup ran (runtime.cores): a container sees the
  host's /proc/stat, whose 16 cores read idle while the container spends every bit of its 2 CPUs' quota.
It drops threads (as many as were waiting, rounded, at least one) once windows in a row with at least
`drop_waiting` threads waiting add up to `drop_windows` windows' time (`drop_windows * window_s`; a window lasts
whole steps, so one long step counts for its length: a 512-token prefill beside one busy process took 2.2-2.6 s
on 2 threads, 0.70-0.72 waiting, and the decode after it then began on 2 threads for one more window, at about
half the speed of 1 thread; two windows of 0.1 s by default: two of 0.25 s took 0.5 s to react, about
as long as a 64-token gguf decode lasts at idle speed, spent on 2 threads that a busy process holds to 29% of
their idle speed; a request beside one busy process then kept 49% of its idle speed, 57% with 0.1 s windows;
docs/benchmarks.md), or after a single window with at least `drop_now_waiting` threads waiting (about a whole
thread short, as beside two busy processes on 2 cores, 1.0 waiting, where an idle machine reads 0.01: the second
window cost another 0.1 s on 2 threads that such load holds to a fifth of their idle speed; one busy process,
about 0.75, mostly still takes two). It adds one back once the cores were `raise_idle` idle or more for
`raise_after_s` seconds in a row, never above the configured count nor below 1. Hysteresis: a raise that is
undone within `probation_s` (the load was still there) doubles the wait before the next raise, up to
`max_raise_after_s`; a raise that holds for `probation_s` resets it. Where schedstat is missing (not Linux) the
waiting threads are estimated as the threads asked for minus the CPU time the process got (`os.times`), and idle
cores as the cores minus the 1-minute load average (slower).

A prefill is one step, and the count changes only between steps: when other programs' threads are running as
the loop starts work after being idle (`LinuxProbe.others_running`, a snapshot of /proc), the controller is
`measuring` until its first window closes, and the loop keeps each of those steps' prefill to
`PROBE_PREFILL_TOKENS`, so that the rest of a long prompt runs on the count that window decides.

A decode-only pass that the native layers run without barriers (runtime/native/decode_team.c: a thread that loses
its core holds nobody up, its work is finished by the others) runs that team on every configured thread whatever the
count: beside busy programs two such threads still get more of the machine than one (the loop asks
`Scheduler.team_decode_next`, calls `begin_step(wide=True)` and sets `ModelRunner.team_threads`). The count governs
everything else, those steps' torch kernels included: the first decode step after a prompt copies the prompt's KV
into the decode mirror (kv.mirror: each layer's K and V gathered from the pages and copied in, over a hundred small
torch calls, each an OpenMP region whose end waits for every thread of its team); run on two threads beside two
busy processes, that step took 0.6-1.6 s where the pass itself takes 25 ms (docs/benchmarks.md). Such "wide" steps
keep the cores busy, so idle cores cannot say the machine has room again: a window that ran mostly wide raises the
count once its threads waited less than `raise_waiting` (an idle machine reads about 0.01 there, one busy process
beside two threads on 2 cores 0.67).

The controller only decides; the loop thread applies the count with `torch.set_num_threads` before a step
(runtime.engine.loop), so no forward pass ever changes threads midway. It is torch-free: tests drive it with a
fake probe and clock. `EngineConfig.thread_policy="fixed"` keeps the configured count (benchmarks).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from radixcache.runtime.cores import CpuQuota, cgroup_quota

THREAD_POLICIES = ("adaptive", "fixed")
# the most threads an engine may ask for: OpenMP creates every thread asked for at the first parallel kernel, and
# past the process's thread limit libgomp ends the process (torch refuses 2**31 and more outright)
MAX_THREADS = 1024
# prompt tokens a step may prefill while the controller is `measuring`: about 0.2 s of SmolLM2 on 2 idle cores, so
# that the window closes after one such step (a window is 0.1 s or more)
PROBE_PREFILL_TOKENS = 128
log = logging.getLogger("radixcache.engine")


def check_threads(threads: object) -> None:
    """Refuse a thread count that is not an int from 1 to MAX_THREADS (None: the default count)."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be an int from 1 to {MAX_THREADS}, got {threads!r}")


def check_thread_policy(policy: object) -> None:
    if policy not in THREAD_POLICIES:
        raise ValueError(f"thread_policy must be one of {', '.join(THREAD_POLICIES)}, got {policy!r}")


@dataclass(frozen=True, slots=True)
class Reading:
    """Cumulative counters at one instant, in seconds (only differences between two readings mean anything)."""

    run: float  # CPU time this process's threads ran
    wait: float | None  # time its threads were ready to run but waited for a core; None where not measurable
    idle: float  # idle time of the cores it may run on, summed over those cores


class Probe(Protocol):
    def read(self) -> Reading: ...


class StepThreads(NamedTuple):
    """The threads one step runs on (`ThreadController.begin_step`)."""

    torch: int  # torch's count (torch.set_num_threads): its kernels' OpenMP regions
    team: int  # a decode-only pass's native team (ModelRunner.team_threads, DecodeBatch.team); 0: torch's count


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's thresholds (module docstring); the defaults are what the engine runs with."""

    window_s: float = 0.1
    drop_waiting: float = 0.4
    drop_windows: int = 2
    drop_now_waiting: float = 0.8
    raise_idle: float = 0.6
    raise_waiting: float = 0.2
    raise_after_s: float = 1.0
    max_raise_after_s: float = 60.0
    probation_s: float = 5.0


class ThreadController:
    """The engine loop's thread count (`threads`), between 1 and `max_threads`. Call `begin_step` before and
    `end_step` after each step, `pause` when the loop goes idle; all on the loop thread."""

    def __init__(
        self,
        max_threads: int,
        adaptive: bool = True,
        probe: Probe | None = None,
        clock: Callable[[], float] = time.monotonic,
        settings: ControllerSettings | None = None,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.max_threads = max_threads
        self.threads = max_threads  # the count the next step runs on
        self.adaptive = adaptive and max_threads > 1
        self.changes = 0  # times the count changed
        self.settings = settings or ControllerSettings()
        self._probe = probe
        self._clock = clock
        self._start: tuple[float, Reading] | None = None  # the open window: when, and the counters then
        self._starved = 0.0  # seconds of windows in a row with too many threads waiting
        self._idle_since: float | None = None  # start of the run of windows with a spare core
        self._backoff = 1  # the raise wait's multiple of raise_after_s (doubled by each raise undone on probation)
        self._raised_at: float | None = None  # the last raise, while on probation
        self._known = False  # a window closed since the loop last went idle: the machine was measured since
        self._others: int | None = None  # other programs' threads running when the first window after idle opened
        self._step: tuple[float, bool] | None = None  # the open step: when it began, whether it runs wide
        self._wide_s = 0.0  # seconds of the open window's steps that ran on more threads than the count

    @property
    def raise_after_s(self) -> float:
        """Seconds of idle cores the next raise waits for (doubled by each raise undone on probation)."""
        cfg = self.settings
        return min(cfg.raise_after_s * self._backoff, max(cfg.raise_after_s, cfg.max_raise_after_s))

    @property
    def measuring(self) -> bool:
        """Whether the loop should keep this step's prefill short (`PROBE_PREFILL_TOKENS`): on more than one
        thread, no window has closed since the loop last went idle (`pause`) or began, and other programs' threads
        were running when this stretch of work began (the probe's `others_running`; unknown counts as none). A long
        prompt's prefill is then not one step on threads a busy machine holds back: the window closes after the
        short step and the rest of the prompt runs on what it decided. Beside one busy process a 512-token
        prefill on 2 threads took 2.1-2.6 s as one step, 1.5-1.7 s so (docs/benchmarks.md); on an idle machine the
        step is not cut (cutting it there cost 7% of the time to first token)."""
        return self.adaptive and self.threads > 1 and not self._known and (self._others or 0) > 0

    def begin_step(self, wide: bool = False) -> StepThreads:
        """Open a window if none is open; the threads this step runs on: torch's kernels on the count, and a `wide`
        step's native team (a decode-only pass without barriers, module docstring) on `max_threads`."""
        if self.adaptive and self._start is None:
            try:
                if not self._known and self._others is None:  # the first window after idle: anyone else running?
                    others = getattr(self._probe_or_default(), "others_running", None)
                    self._others = others() if others is not None else None
                self._start = (self._clock(), self._read())
                self._wide_s = 0.0
            except Exception as exc:
                self._give_up(exc)
        if self._start is not None:
            self._step = (self._clock(), wide and self.threads < self.max_threads)
        return StepThreads(self.threads, self.max_threads if wide else 0)

    def end_step(self) -> None:
        """Close the window once it is `window_s` long, and decide on it."""
        if self._start is None:
            return
        now = self._clock()
        if self._step is not None and self._step[1]:
            self._wide_s += now - self._step[0]
        self._step = None
        t0, r0 = self._start
        if now - t0 < self.settings.window_s:
            return
        self._start = None
        try:
            r1 = self._read()
        except Exception as exc:
            self._give_up(exc)
            return
        self._known = True
        wall = now - t0
        if wall > 0:
            self._decide(now, wall, r0, r1)
        # the next window opens on this reading: one reading a window (a reading is 4-6 /proc files, 0.25 ms on an
        # idle 2-core VM, more on a busy one); an idle gap before the next step is dropped by `pause`
        self._start = (now, r1)
        self._wide_s = 0.0

    def pause(self) -> None:
        """The loop goes idle: the open window is dropped (its gap would read as idle cores), and what the machine
        gives is not known again until a window closes (`measuring`)."""
        self._start = None
        self._step = None
        self._known = False
        self._others = None

    # ------------------------------------------------------------------ private

    def _give_up(self, exc: Exception) -> None:
        """The probe failed (a /proc file gone or of another shape): the count stays where it is for good. Raised,
        it was a step's error, and every request in flight failed at every step."""
        log.warning("thread control stops at %d threads: the machine cannot be measured (%r)", self.threads, exc)
        self.adaptive = False
        self._start = None

    def _probe_or_default(self) -> Probe:
        if self._probe is None:
            self._probe = default_probe()
        return self._probe

    def _read(self) -> Reading:
        return self._probe_or_default().read()

    def _decide(self, now: float, wall: float, r0: Reading, r1: Reading) -> None:
        cfg, n = self.settings, self.threads
        if r1.wait is not None and r0.wait is not None:
            waiting = (r1.wait - r0.wait) / wall
        else:  # threads asked for minus the cores got (spinning OpenMP threads count as got)
            waiting = max(0.0, n - (r1.run - r0.run) / wall)
        idle = (r1.idle - r0.idle) / wall
        if self._raised_at is not None and now - self._raised_at >= cfg.probation_s:
            self._raised_at = None  # the last raise held: the next may come as soon as the first
            self._backoff = 1
        # starved time, not windows: a window is one step long at least, and one long step (a prompt's prefill)
        # starved for seconds says as much as many short windows
        self._starved = self._starved + wall if waiting >= cfg.drop_waiting else 0.0
        starved_long = self._starved >= cfg.drop_windows * cfg.window_s * (1 - 1e-9)
        if (starved_long or waiting >= cfg.drop_now_waiting) and n > 1:
            if self._raised_at is not None:  # undone on probation: wait longer before trying again
                if self.raise_after_s < cfg.max_raise_after_s:
                    self._backoff *= 2
                self._raised_at = None
            self._set(max(1, n - max(1, int(waiting + 0.5))))
            return
        # room: idle cores, or (windows run mostly on every thread, which leave no core idle) threads that hardly wait
        room = idle >= cfg.raise_idle or (self._wide_s >= wall / 2 and waiting < cfg.raise_waiting)
        if not room or waiting >= cfg.drop_waiting or n >= self.max_threads:
            self._idle_since = None
            return
        if self._idle_since is None:
            self._idle_since = now - wall
        if now - self._idle_since >= self.raise_after_s:
            self._set(n + 1)
            self._raised_at = now

    def _set(self, n: int) -> None:
        self.threads = max(1, min(self.max_threads, n))
        self.changes += 1
        self._starved = 0.0
        self._idle_since = None


# ---------------------------------------------------------------------- probes


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _stat_cpus(stat: str) -> set[str]:
    """The /proc/stat lines of the CPUs this process may run on: those its affinity names, or, where /proc/stat
    numbers none of them (a container whose lxcfs shows its own CPUs as cpu0..cpuN-1 while the affinity keeps the
    host's numbers), every CPU line it shows: the container's. Keyed on the affinity alone, the idle cores read 0
    there for ever, and a count once dropped never came back."""
    wanted = {f"cpu{i}" for i in _affinity()}
    try:
        with open(stat) as f:
            shown = {name for line in f if (name := line.partition(" ")[0]).startswith("cpu") and name != "cpu"}
    except OSError:
        return wanted
    return wanted & shown or shown


class LinuxProbe:
    """Run and run-queue wait of every thread of this process (/proc/self/task/*/schedstat, nanoseconds), and
    idle plus iowait of the CPUs in its affinity (`stat`, /proc/stat, clock ticks; see _stat_cpus), under a
    cgroup `quota` at most the quota's CPU time less what the cgroup ran (`default_probe` passes this process's)."""

    def __init__(
        self, stat: str = "/proc/stat", quota: CpuQuota | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stat = stat
        self._quota = quota
        self._clock = clock
        self._last: tuple[float, float, float | None] | None = None  # the last reading: when, idle (s), cgroup used
        self._idle = 0.0  # idle core-seconds: /proc/stat's at the first reading, then what each reading adds
        self._cpus = _stat_cpus(stat)
        self._tick = 1.0 / os.sysconf("SC_CLK_TCK")
        self._seen: dict[str, tuple[int, int]] = {}  # per thread: its counters at the last reading
        self._run_ns = 0  # what every thread ran and waited since the first reading, ended threads included
        self._wait_ns = 0

    @staticmethod
    def available() -> bool:
        return os.path.exists("/proc/self/schedstat") and os.path.exists("/proc/stat")

    @staticmethod
    def others_running() -> int | None:
        """Threads of other programs running or ready to run now: the system's count (/proc/loadavg's fourth field,
        running/total) less this process's threads in state R (/proc/self/task/*/stat). None if unreadable."""
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
            own = 0
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/stat") as f:
                        own += f.read().rpartition(")")[2].split()[0] == "R"
                except OSError:  # the thread ended meanwhile
                    continue
        except (OSError, ValueError, IndexError):
            return None
        return max(0, running - own)

    def read(self) -> Reading:
        seen: dict[str, tuple[int, int]] = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    run, wait = (int(v) for v in f.read().split()[:2])
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
            seen[tid] = (run, wait)
            run0, wait0 = self._seen.get(tid, (0, 0))  # a thread new since the last reading counts from 0
            self._run_ns += run - run0
            self._wait_ns += wait - wait0
        self._seen = seen
        ticks = 0
        with open(self._stat) as f:
            for line in f:
                name, _, rest = line.partition(" ")
                if name in self._cpus:
                    fields = rest.split()
                    ticks += int(fields[3]) + int(fields[4])  # idle, iowait
        now, idle = self._clock(), ticks * self._tick
        used = self._quota.used_s() if self._quota is not None else None
        if self._last is None:
            self._idle = idle
        else:
            t0, idle0, used0 = self._last
            spare = idle - idle0
            if self._quota is not None and used is not None and used0 is not None:  # the quota's time left over
                spare = min(spare, max(0.0, self._quota.cpus * (now - t0) - (used - used0)))
            self._idle += spare
        self._last = (now, idle, used)
        return Reading(run=self._run_ns / 1e9, wait=self._wait_ns / 1e9, idle=self._idle)


class PortableProbe:
    """Where schedstat is missing: the process's CPU time (`os.times`), no wait, and idle cores integrated from
    the 1-minute load average (cores minus load, at least 0) between readings."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._cores = len(_affinity())
        self._clock = clock
        self._last = clock()
        self._idle = 0.0

    def read(self) -> Reading:
        now = self._clock()
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = float(self._cores)  # unknown: never reads as idle, so never raises
        self._idle += max(0.0, self._cores - load) * (now - self._last)
        self._last = now
        t = os.times()
        return Reading(run=t.user + t.system, wait=None, idle=self._idle)


def default_probe() -> Probe:
    return LinuxProbe(quota=cgroup_quota()) if LinuxProbe.available() else PortableProbe()
