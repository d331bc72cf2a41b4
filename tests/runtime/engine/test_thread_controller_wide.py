"""The thread controller's "wide" steps (runtime.engine.threads): decode-only passes the native layers run without
barriers give their team every configured thread whatever the count, while torch's kernels in those steps and the
other steps run on the count, which still follows the machine; and, since wide steps leave no core idle, it comes
back up once the wide steps' threads hardly wait. On test_thread_controller.py's simulated fair-share machine and
fake clock."""

from __future__ import annotations

from radixcache.runtime.engine.threads import ThreadController
from tests.runtime.engine.test_thread_controller import STEP, Machine, controller


def run_wide(machine: Machine, ctl: ThreadController, seconds: float, wide: bool = True) -> tuple[list[int], list[int]]:
    """Steps back to back for `seconds`, every one `wide` (a decode-only team pass) or none: the threads each step
    ran on (its native team, or torch's count where it has none), and the controller's count after each."""
    ran, counts = [], []
    end = machine.now + seconds
    while machine.now < end - 1e-9:
        count = ctl.threads
        step = ctl.begin_step(wide=wide)
        assert step.torch == count  # torch's kernels always on the count, a wide step's included
        assert step.team == (2 if wide else 0)
        ran.append(step.team or step.torch)
        machine.advance(STEP, ran[-1])
        ctl.end_step()
        counts.append(ctl.threads)
    return ran, counts


def test_wide_steps_run_on_every_thread_while_the_count_drops_beside_busy_processes() -> None:
    for busy in (1, 2):
        m = Machine(2, busy=busy)
        ctl = controller(m)
        ran, counts = run_wide(m, ctl, 10)
        assert set(ran) == {2}  # every decode-only team pass on both threads
        assert counts[-1] == 1 and ctl.changes == 1  # the count (prefill, barrier kernels) dropped and stays
        assert ctl.begin_step(wide=False) == (1, 0)  # a step that is not wide runs on the count, no team
        ctl.end_step()


def test_the_count_comes_back_while_only_wide_steps_run_once_the_load_is_gone() -> None:
    """Wide steps fill both cores, so the cores never read idle: before the waiting rule, a count dropped beside a
    busy process stayed at 1 for as long as decodes ran, long after the load had gone."""
    m = Machine(2, busy=lambda t: 1 if t < 5 else 0)
    ctl = controller(m)
    ran, counts = run_wide(m, ctl, 10)
    assert set(ran) == {2}
    changed = [round((i + 1) * STEP, 2) for i, n in enumerate(counts) if i and n != counts[i - 1]]
    assert len(changed) == 2 and changed[0] <= 1.0  # dropped beside the busy process
    assert 5.0 < changed[1] <= 6.5  # back a second or so after the load ended (idle reads 0 all along)
    assert counts[-1] == 2


def test_wide_steps_beside_a_busy_process_do_not_raise_the_count() -> None:
    m = Machine(2, busy=1)  # two wide threads and one busy process on 2 cores: 0.67 of ours wait
    ctl = controller(m)
    _, counts = run_wide(m, ctl, 30)
    assert counts[-1] == 1 and ctl.changes == 1


def test_steps_that_are_not_wide_keep_the_idle_rule() -> None:
    m = Machine(2, busy=lambda t: 1 if t < 5 else 0)
    ctl = controller(m)
    ran, counts = run_wide(m, ctl, 10, wide=False)
    assert ran[-1] == 2 and counts[-1] == 2 and ctl.changes == 2  # dropped, and back on idle cores as before
