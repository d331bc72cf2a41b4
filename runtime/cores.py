"""The cores this process may use: the CPUs its affinity names (taskset, a cpuset), and no more than its cgroup's
CPU quota allows (a container run with `--cpus 2` on a 16-core host: cgroup v2 `cpu.max` "200000 100000", v1
`cpu.cfs_quota_us` 200000 over `cpu.cfs_period_us` 100000), rounded up.

Why: torch's own default thread count follows the affinity but not the quota (torch 2.13: 1 under `taskset -c 0`,
2 in a cgroup v1 of 1 CPU's quota on this 2-core machine). In a container held to 2 CPUs' time on a 16-core host
it would run 16 OpenMP threads, spinning at every kernel's barrier (OMP_WAIT_POLICY=ACTIVE) on the same 2 CPUs'
worth of time and throttled together for the rest of each period: the barrier collapse the thread controller
exists for (runtime.engine.threads), from the first step (inferred, not measured: no such container here). The
engine's default count, `radixcache doctor`'s and each Ray replica's share (cli.replicas) are capped by
`usable_cores()`.

The quota is the least over the process's cgroup and its ancestors (a pod's limit above a container's), read from
/proc/self/cgroup and the hierarchy under /sys/fs/cgroup; inside a container whose /proc/self/cgroup names the
host's path, the mount's own root (the container's cgroup) is read. Unreadable or absent files mean no quota. Both
paths are arguments, so tests give fake trees. Torch-free.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
OWN_CGROUP = "/proc/self/cgroup"


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; every CPU where the platform has no affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cgroup_cpu_limit(root: str | None = None, own: str | None = None) -> float | None:
    """CPUs' worth of time per period that the cgroup quota allows this process (the least over its cgroup and
    its ancestors, v2 or v1), or None where no quota applies or none can be read. `root`: the cgroup mount
    (CGROUP_ROOT), `own`: the process's cgroup file (OWN_CGROUP)."""
    root = root or CGROUP_ROOT
    try:
        lines = Path(own or OWN_CGROUP).read_text().splitlines()
    except OSError:
        lines = []
    limits: list[float] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2's one line, "0::/path"
            limits += _limits(Path(root), path, _v2_limit)
        elif "cpu" in controllers.split(","):  # v1's cpu controller, "4:cpu,cpuacct:/path"
            for mount in (controllers, "cpu,cpuacct", "cpu"):
                if (Path(root) / mount).is_dir():
                    limits += _limits(Path(root) / mount, path, _v1_limit)
                    break
    if not lines:  # no /proc: the mount's own root, as a container sees its cgroup
        limits += [x for x in (_v2_limit(Path(root)), _v1_limit(Path(root) / "cpu")) if x is not None]
    return min(limits) if limits else None


def usable_cores(root: str | None = None, own: str | None = None) -> int:
    """The threads this process can keep running: its affinity's CPUs, at most the cgroup quota rounded up, at
    least 1."""
    cpus = len(affinity_cpus())
    limit = cgroup_cpu_limit(root, own)
    return cpus if limit is None else max(1, min(cpus, math.ceil(limit - 1e-9)))


def default_threads(asked: int, root: str | None = None, own: str | None = None) -> int:
    """The thread count when none is given: `asked` (torch's count: OMP_NUM_THREADS, `torch.set_num_threads`, else
    the affinity's cores), at most `usable_cores()`."""
    return max(1, min(asked, usable_cores(root, own)))


# ---------------------------------------------------------------------- private


def _limits(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The limits `read` finds in the cgroup `path` under `mount` and each of its ancestors up to the mount's root
    (a path the mount does not show, as a container's /proc names the host's: the root alone)."""
    found: list[float] = []
    here = Path(path.strip() or "/")
    for folder in (here, *here.parents):
        limit = read(mount / str(folder).lstrip("/"))
        if limit is not None:
            found.append(limit)
    return found


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return _ratio(quota, period)


def _ratio(quota: int, period: int) -> float | None:
    return quota / period if quota > 0 and period > 0 else None  # v1 writes -1 for no quota
