"""The thread controller's decisions (runtime.engine.threads) on a simulated machine: `cores` cores shared fairly
between the engine's runnable threads (the controller's count) and `busy` other single-thread processes, as
Linux's scheduler shares them. Busy drops, idle comes back, short bursts and on-off loads do not make it flap,
and the count stays within 1 and the configured threads. A fake clock: every run is deterministic and instant."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from radixcache.runtime.engine.threads import (
    THREAD_POLICIES,
    ControllerSettings,
    LinuxProbe,
    PortableProbe,
    Reading,
    ThreadController,
    check_thread_policy,
)

STEP = 1 / 16  # seconds a simulated decode step takes (exact in binary: windows of 0.25 s are 4 steps)


class Machine:
    """A fair-share CPU: our n threads and `busy` others runnable, each thread gets min(1, cores / (n + busy)) of
    a core; what it does not get it waits for. Idle cores: those neither side fills. `wait_known=False` models a
    system without schedstat (no wait counter)."""

    def __init__(self, cores: int, busy: int | Callable[[float], int] = 0, wait_known: bool = True) -> None:
        self.cores = cores
        self.busy = busy
        self.wait_known = wait_known
        self.now = 0.0
        self.run = self.wait = self.idle = 0.0
        self.reads = 0

    def others(self) -> int:
        return self.busy(self.now) if callable(self.busy) else self.busy

    def advance(self, dt: float, ours: int) -> None:
        others = self.others()
        share = min(1.0, self.cores / (ours + others)) if ours + others else 1.0
        self.run += dt * ours * share
        self.wait += dt * ours * (1.0 - share)
        self.idle += dt * max(0.0, self.cores - ours - others)
        self.now += dt

    def read(self) -> Reading:
        self.reads += 1
        return Reading(run=self.run, wait=self.wait if self.wait_known else None, idle=self.idle)

    def clock(self) -> float:
        return self.now


def controller(machine: Machine, max_threads: int = 2, **settings: float) -> ThreadController:
    """A controller on `machine`, with windows of 0.25 s (4 steps) unless `settings` say otherwise: the tests
    below count steps in those windows; `test_the_default_window_drops_within_a_quarter_second` checks the default."""
    cfg = ControllerSettings(**{"window_s": 0.25, **settings})  # type: ignore[arg-type]
    return ThreadController(max_threads, probe=machine, clock=machine.clock, settings=cfg)


def run(machine: Machine, ctl: ThreadController, seconds: float, step: float = STEP) -> list[int]:
    """Steps back to back for `seconds`, as the engine loop runs them: the thread count of each step."""
    counts = []
    end = machine.now + seconds
    while machine.now < end - 1e-9:
        n = ctl.begin_step().torch
        counts.append(n)
        machine.advance(step, n)
        ctl.end_step()
    return counts


def test_an_idle_machine_keeps_every_thread() -> None:
    for cores in (2, 4, 8):
        m = Machine(cores)
        ctl = controller(m, max_threads=cores)
        assert set(run(m, ctl, 60)) == {cores}
        assert ctl.changes == 0


def test_one_busy_process_drops_a_two_thread_engine_to_one_and_it_stays() -> None:
    m = Machine(2, busy=1)
    ctl = controller(m)
    counts = run(m, ctl, 60)
    # Two starved windows of 0.25 s, each 4 steps: the 9th step runs on one thread.
    assert counts[:8] == [2] * 8 and set(counts[8:]) == {1}
    assert ctl.changes == 1  # no core is idle beside one thread and the busy process: it never tries again


def test_the_default_window_drops_within_a_quarter_second() -> None:
    # the engine's defaults: two windows of 0.1 s (2 steps each here) beside one busy process, then one thread
    machine = Machine(cores=2, busy=1)
    ctl = ThreadController(2, probe=machine, clock=machine.clock)
    counts = run(machine, ctl, 1.0)
    assert counts[:4] == [2, 2, 2, 2] and set(counts[4:]) == {1}


def test_a_whole_thread_waiting_drops_after_one_window_and_less_after_two() -> None:
    two = Machine(2, busy=2)  # 2 ours + 2 others on 2 cores: 1.0 of ours waits
    counts = run(two, controller(two), 2)
    assert counts[:4] == [2] * 4 and set(counts[4:]) == {1}
    one = Machine(2, busy=1)  # 0.67 waits: under drop_now_waiting, so two windows
    counts = run(one, controller(one), 2)
    assert counts[:8] == [2] * 8 and set(counts[8:]) == {1}
    burst = Machine(2, busy=lambda t: 2 if 5.0 <= t < 5.25 else 0)  # one window of two busy processes
    ctl = controller(burst)
    counts = run(burst, ctl, 15)
    assert ctl.changes == 2 and counts[-1] == 2  # dropped on it, and back once the cores were idle a second


def test_two_busy_processes_drop_to_one_and_never_below() -> None:
    for busy in (2, 5):
        m = Machine(2, busy=busy)
        ctl = controller(m)
        counts = run(m, ctl, 30)
        assert min(counts) == 1 and counts[-1] == 1
        assert ctl.changes == 1


def test_it_drops_as_many_threads_as_were_waiting() -> None:
    m = Machine(8, busy=3)  # 8 ours + 3 others on 8 cores: 2.2 of ours wait on average
    ctl = controller(m, max_threads=8)
    counts = run(m, ctl, 30)
    assert counts[:4] == [8] * 4 and counts[4] == 6  # one window that short of threads decides: 8 - round(2.18)
    assert counts[-1] == 5  # 6 + 3 on 8 still leaves 0.5 waiting: one more; then 5 + 3 = 8 fit exactly
    assert ctl.changes == 2


def test_it_comes_back_once_the_cores_are_idle() -> None:
    m = Machine(2, busy=lambda t: 1 if t < 10 else 0)
    ctl = controller(m)
    counts = run(m, ctl, 20)
    at = [round(i * STEP, 2) for i, n in enumerate(counts) if i and n != counts[i - 1]]
    assert len(at) == 2
    assert at[0] == 0.5  # dropped after two starved windows
    # the load ends at 10 s; the first window that saw it gone started there: one second of idle windows later
    assert 10.0 < at[1] <= 11.25 + 1e-9
    assert counts[-1] == 2


def test_a_short_burst_does_not_drop() -> None:
    m = Machine(2, busy=lambda t: 1 if 5.0 <= t < 5.2 else 0)  # under one window of load
    ctl = controller(m)
    assert set(run(m, ctl, 15)) == {2}
    assert ctl.changes == 0


def test_an_on_off_load_backs_off_instead_of_flapping() -> None:
    """A load busy 1.5 s of every 3 s: each raise fails within its probation, so the next raise waits twice as
    long; the engine soon stays on one thread while the load goes on, then returns once it has stopped."""

    def load(t: float) -> int:
        return 1 if t < 120 and t % 3.0 < 1.5 else 0

    flat = Machine(2, busy=load)
    no_backoff = controller(flat, max_raise_after_s=1.0)
    run(flat, no_backoff, 120)
    assert no_backoff.changes >= 70  # every idle half (1.5 s > the 1 s raise wait) raises, every busy half drops
    m = Machine(2, busy=load)
    ctl = controller(m)
    counts = run(m, ctl, 120)
    assert ctl.changes <= 4  # after the first failed raise the wait is 2 s: longer than any idle half
    assert counts[-1] == 1
    back = run(m, ctl, 10)  # the load has stopped: back to 2 after the (doubled) raise wait
    assert back[-1] == 2 and back.count(2) > len(back) / 2


def test_a_raise_that_holds_resets_the_backoff() -> None:
    phases = [(0, 1), (5, 0), (6.4, 1), (10, 0), (30, 1), (40, 0)]  # (from t, busy)

    def busy(t: float) -> int:
        return next(b for start, b in reversed(phases) if t >= start)

    m = Machine(2, busy=busy)
    ctl = controller(m)
    run(m, ctl, 12)  # dropped, raised at ~6 s, undone at ~6.9 s (probation): the raise wait is now 2 s
    assert ctl.raise_after_s == 2.0
    run(m, ctl, 18)  # raised at ~12 s, held past its 5 s probation
    run(m, ctl, 10)  # a drop after a raise that held: the next raise waits the base second again
    assert ctl.raise_after_s == 1.0
    counts = run(m, ctl, 5)  # load gone at 40 s
    assert counts[-1] == 2


def test_the_count_never_exceeds_the_configured_threads() -> None:
    m = Machine(8)  # 8 idle cores, but the user asked for 3
    ctl = controller(m, max_threads=3)
    assert max(run(m, ctl, 30)) == 3
    one = ThreadController(1, probe=m, clock=m.clock)  # nothing to adapt: never reads the machine
    reads = m.reads
    assert set(run(m, one, 10)) == {1} and m.reads == reads
    assert not one.adaptive


def test_fixed_keeps_the_configured_count_on_a_busy_machine() -> None:
    m = Machine(2, busy=2)
    ctl = ThreadController(2, adaptive=False, probe=m, clock=m.clock)
    assert set(run(m, ctl, 30)) == {2} and ctl.changes == 0 and m.reads == 0


def test_decisions_come_only_from_windows_of_back_to_back_steps() -> None:
    """An idle gap between two bursts of steps (the loop had no work) is not read as idle cores."""
    m = Machine(2, busy=1)
    ctl = controller(m)
    run(m, ctl, 2)
    assert ctl.threads == 1
    for _ in range(20):  # one step, then a gap of 2 s with no engine work: the busy process has the cores
        ctl.begin_step()
        m.advance(STEP, ctl.threads)
        ctl.end_step()
        ctl.pause()
        m.advance(2.0, 0)
    assert ctl.threads == 1 and ctl.changes == 1


def test_without_a_wait_counter_the_cpu_shortfall_stands_in() -> None:
    m = Machine(2, busy=1, wait_known=False)
    ctl = controller(m)
    assert run(m, ctl, 10)[-1] == 1
    m.busy = 0
    assert run(m, ctl, 5)[-1] == 2


def test_a_long_starved_step_counts_for_its_length() -> None:
    """A window closes after whole steps: one 1 s prefill step starved beside a busy process is as much evidence
    as four windows of 0.25 s, and the steps after it run on one thread; a short starved step is not."""
    m = Machine(2, busy=1)
    counts = run(m, controller(m), 10, step=1.0)  # a long prefill chunk per step
    assert counts[:3] == [2, 1, 1]
    m = Machine(2, busy=lambda t: 1 if t < 0.3 else 0)  # one starved window of 0.3 s, under 2 x 0.25
    ctl = controller(m)
    counts = run(m, ctl, 3, step=0.3)
    assert set(counts) == {2} and ctl.changes == 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_threads must be >= 1"):
        ThreadController(0)
    for bad in ("spin", None, 2, ["fixed"]):
        with pytest.raises(ValueError, match="thread_policy must be one of adaptive, fixed"):
            check_thread_policy(bad)
    for good in THREAD_POLICIES:
        check_thread_policy(good)


class Others(Machine):
    """A machine whose probe also answers `others_running` (LinuxProbe's snapshot of other programs' threads)."""

    def __init__(self, cores: int, busy: int) -> None:
        super().__init__(cores, busy)
        self.asked = 0

    def others_running(self) -> int:
        self.asked += 1
        return self.others()


def test_measuring_while_others_run_until_a_window_closes_and_again_after_idle() -> None:
    m = Others(2, busy=1)
    ctl = controller(m)
    assert not ctl.measuring  # nothing asked yet: no step began
    ctl.begin_step()
    assert ctl.measuring and m.asked == 1
    m.advance(STEP, 2)
    ctl.end_step()  # 1/16 s: the window (0.25 s) is still open
    assert ctl.measuring
    run(m, ctl, 0.25)
    assert not ctl.measuring  # a window closed: the count follows the windows from here
    ctl.pause()
    assert not ctl.measuring  # nobody asked yet
    ctl.begin_step()
    assert ctl.measuring and m.asked == 2  # once per stretch of work


def test_not_measuring_on_an_idle_machine_one_thread_or_without_the_snapshot() -> None:
    idle = Others(2, busy=0)
    ctl = controller(idle)
    ctl.begin_step()
    assert not ctl.measuring
    one = Others(2, busy=1)
    ctl = controller(one, max_threads=1)
    ctl.begin_step()
    assert not ctl.measuring and one.asked == 0
    plain = Machine(2, busy=1)  # a probe without others_running (the portable one): unknown counts as none
    ctl = controller(plain)
    ctl.begin_step()
    assert not ctl.measuring


@pytest.mark.skipif(not LinuxProbe.available(), reason="Linux /proc only")
def test_the_linux_probe_counts_other_programs_running() -> None:
    import subprocess
    import sys

    assert LinuxProbe.others_running() is not None
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 10
        while (n := LinuxProbe.others_running()) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the process starting up may sleep on its imports
        assert n is not None and n >= 1
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not LinuxProbe.available(), reason="Linux /proc only")
def test_the_linux_probe_reads_this_process() -> None:
    probe = LinuxProbe()
    a = probe.read()
    t = time.process_time()
    while time.process_time() - t < 0.05:  # burn 50 ms of CPU on this thread
        pass
    b = probe.read()
    assert b.run - a.run >= 0.04
    assert a.wait is not None and b.wait is not None and b.wait >= a.wait
    assert b.idle >= a.idle


def test_the_portable_probe_counts_cpu_time() -> None:
    probe = PortableProbe()
    a = probe.read()
    t = time.process_time()
    while time.process_time() - t < 0.1:
        pass
    b = probe.read()
    # os.times counts in clock ticks (10 ms): each end may lose up to one (CI read 0.04 after 0.05 s of spinning)
    assert b.wait is None and b.run - a.run >= 0.1 - 0.021 and b.idle >= a.idle


@pytest.mark.skipif(not LinuxProbe.available(), reason="Linux /proc only")
def test_the_linux_probe_reads_a_containers_renumbered_cpus(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lxcfs shows a container its CPUs as cpu0 and cpu1 while its affinity names the host's 4 and 5: the idle
    cores are read from the lines shown (they read 0 for ever, so a dropped count never came back); where the
    affinity's names are shown, only those lines count."""
    import radixcache.runtime.engine.threads as threads_module

    stat = tmp_path / "stat"
    tick = 1.0 / os.sysconf("SC_CLK_TCK")

    def write(idle: int) -> None:  # user nice system idle iowait ...: each CPU `idle` ticks idle, 1 waiting on I/O
        lines = [f"cpu  1 0 1 {2 * idle} 2 0 0 0 0 0"]
        lines += [f"cpu{i} 1 0 1 {idle} 1 0 0 0 0 0" for i in range(2)]
        stat.write_text("\n".join([*lines, "intr 0", ""]))

    write(100)
    monkeypatch.setattr(threads_module, "_affinity", lambda: [4, 5])
    probe = LinuxProbe(stat=str(stat))
    a = probe.read()
    write(150)
    b = probe.read()
    assert b.idle - a.idle == pytest.approx(2 * 50 * tick)
    monkeypatch.setattr(threads_module, "_affinity", lambda: [1, 5])  # cpu1 is shown: it alone counts
    probe = LinuxProbe(stat=str(stat))
    assert probe.read().idle == pytest.approx(151 * tick)


def test_back_to_back_windows_share_their_readings_and_an_idle_gap_opens_a_fresh_one() -> None:
    """A reading is 4-6 /proc files (about 0.25 ms in the engine's process): the window after a closed one opens on
    the reading that closed it, so steps back to back cost one reading a window; after the loop idles (`pause`)
    the next window opens on a reading of its own, so the gap is never counted."""
    m = Machine(2)
    ctl = controller(m)
    run(m, ctl, 10)  # 40 windows of 4 steps
    assert m.reads == 40 + 1
    ctl.pause()
    m.advance(2.0, 0)  # the gap: both cores idle, ours waiting for nothing
    m.busy = 2
    run(m, ctl, 0.5)  # beside two busy processes: the first window after the gap reads only its own steps
    assert m.reads == 41 + 1 + 2 and ctl.threads == 1
