"""The cores this process may use: the CPUs its affinity names (taskset, a cpuset), and no more than its cgroup's
CPU quota allows (a container run with `--cpus 2` on a 16-core host: cgroup v2 `cpu.max` "200000 100000", v1
`cpu.cfs_quota_us` 200000 over `cpu.cfs_period_us` 100000), rounded up.

Why: torch's own default thread count follows the affinity but not the quota (torch 2.13: 1 under `taskset -c 0`,
2 in a cgroup v1 of 1 CPU's quota on this 2-core machine). In a container held to 2 CPUs' time on a 16-core host
it would run 16 OpenMP threads, spinning at every kernel's barrier (OMP_WAIT_POLICY=ACTIVE) on the same 2 CPUs'
worth of time and throttled together for the rest of each period: the barrier collapse the thread controller
exists for (runtime.engine.threads), from the first step (inferred, not measured: no such container here). The
engine's default count, `radixcache doctor`'s and each Ray replica's share (cli.replicas) are capped by
`usable_cores()`. The thread controller's idle cores (runtime.engine.threads) are at most the quota's time that the
cgroup left unused (`CpuQuota.used_s`): the host's /proc/stat, which a container sees, says nothing of its quota.

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
from typing import NamedTuple

CGROUP_ROOT = "/sys/fs/cgroup"
OWN_CGROUP = "/proc/self/cgroup"


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity; every CPU where the platform has no affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


class CpuQuota(NamedTuple):
    """A cgroup's CPU quota: `cpus` CPUs' worth of time per period; `usage`, the file that counts the CPU time of
    every process under that cgroup (v2 cpu.stat's usage_usec, v1 cpuacct.usage in ns), None if there is none."""

    cpus: float
    usage: Path | None = None

    def used_s(self) -> float | None:
        """CPU seconds the cgroup's processes have run (a counter: only differences mean anything); None where
        unreadable."""
        if self.usage is None:
            return None
        try:
            text = self.usage.read_text()
            if self.usage.name == "cpu.stat":  # "usage_usec N" among other lines
                return int(dict(line.split()[:2] for line in text.splitlines() if line.strip())["usage_usec"]) / 1e6
            return int(text) / 1e9
        except (OSError, ValueError, KeyError):
            return None


def cgroup_quota(root: str | None = None, own: str | None = None) -> CpuQuota | None:
    """The cgroup CPU quota that binds this process: the least over its cgroup and its ancestors, v2 or v1; None
    where no quota applies or none can be read. `root`: the cgroup mount (CGROUP_ROOT), `own`: the process's cgroup
    file (OWN_CGROUP)."""
    mount = Path(root or CGROUP_ROOT)
    try:
        lines = Path(own or OWN_CGROUP).read_text().splitlines()
    except OSError:
        lines = []
    found: list[CpuQuota] = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2's one line, "0::/path"
            found += _quotas(mount, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1's cpu controller, "4:cpu,cpuacct:/path"
            for name in (controllers, "cpu,cpuacct", "cpu"):
                if (mount / name).is_dir():
                    found += [_v1_usage(q, mount, name) for q in _quotas(mount / name, path, _v1_quota)]
                    break
    if not lines:  # no /proc: the mount's own root, as a container sees its cgroup
        found += [q for q in (_v2_quota(mount), _v1_quota(mount / "cpu")) if q is not None]
    return min(found, key=lambda q: q.cpus) if found else None


def cgroup_cpu_limit(root: str | None = None, own: str | None = None) -> float | None:
    """CPUs' worth of time per period that the cgroup quota allows this process (`cgroup_quota`), or None."""
    quota = cgroup_quota(root, own)
    return None if quota is None else quota.cpus


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


def _quotas(mount: Path, path: str, read: Callable[[Path], CpuQuota | None]) -> list[CpuQuota]:
    """The quotas `read` finds in the cgroup `path` under `mount` and each of its ancestors up to the mount's root
    (where the mount does not show the path, as a container's /proc names the host's: the root alone)."""
    here = Path(path.strip() or "/")
    return [q for folder in (here, *here.parents) if (q := read(mount / str(folder).lstrip("/"))) is not None]


def _v2_quota(folder: Path) -> CpuQuota | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        cpus = None if quota == "max" else _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None
    return None if cpus is None else CpuQuota(cpus, folder / "cpu.stat")


def _v1_quota(folder: Path) -> CpuQuota | None:
    try:
        cpus = _ratio(int((folder / "cpu.cfs_quota_us").read_text()), int((folder / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None
    return None if cpus is None else CpuQuota(cpus, folder / "cpuacct.usage")


def _v1_usage(quota: CpuQuota, root: Path, mount: str) -> CpuQuota:
    """Where the cpuacct controller has a mount of its own (cpu and cpuacct apart), its counter for the same path."""
    if quota.usage is None or quota.usage.exists():
        return quota
    apart = root / "cpuacct" / quota.usage.parent.relative_to(root / mount) / "cpuacct.usage"
    return quota._replace(usage=apart if apart.exists() else None)


def _ratio(quota: int, period: int) -> float | None:
    return quota / period if quota > 0 and period > 0 else None  # v1 writes -1 for no quota
