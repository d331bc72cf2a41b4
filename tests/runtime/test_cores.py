"""The cores a process may use (runtime.cores) on fake cgroup trees: a container held to 2 CPUs' time on a 16-core
host (cgroup v2 `cpu.max`, v1 cfs quota and period), a quota above the container's, affinity masks with holes, no
quota, unreadable files; and the defaults that follow them: the engine's thread count and each Ray replica's share
and threads (torch's own default is the host's cores, 16 OpenMP threads on 2 CPUs' worth of time)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from radixcache.cli import replicas as replicas_cli
from radixcache.runtime import Engine, cores
from radixcache.runtime.engine import threads as threads_module
from radixcache.runtime.engine.threads import LinuxProbe
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

HOST = set(range(16))  # the affinity of a process on a 16-core host, in a container limited by a quota only


def tree(tmp_path: Path, own: str, files: dict[str, str]) -> tuple[str, str]:
    """A fake cgroup mount (`files`: path under it -> text) and /proc/self/cgroup (`own`); their paths."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(own)
    return str(root), str(proc)


@pytest.fixture
def host16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _pid: HOST)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: len(HOST))


@pytest.mark.usefixtures("host16")
def test_a_v2_container_held_to_two_cpus_on_a_16_core_host_uses_two(tmp_path: Path) -> None:
    root, own = tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})  # docker --cpus 2, its own cgroupns
    assert cores.cgroup_cpu_limit(root, own) == 2.0
    assert cores.usable_cores(root, own) == 2
    assert cores.default_threads(16, root, own) == 2  # torch's 16 on a 16-core host
    assert cores.default_threads(1, root, own) == 1  # OMP_NUM_THREADS=1 or torch.set_num_threads(1) stays


@pytest.mark.usefixtures("host16")
def test_a_fractional_quota_rounds_up_and_never_below_one(tmp_path: Path) -> None:
    root, own = tree(tmp_path, "0::/\n", {"cpu.max": "250000 100000\n"})
    assert cores.usable_cores(root, own) == 3
    root, own = tree(tmp_path / "small", "0::/\n", {"cpu.max": "20000 100000\n"})  # a fifth of a CPU
    assert cores.cgroup_cpu_limit(root, own) == pytest.approx(0.2) and cores.usable_cores(root, own) == 1


@pytest.mark.usefixtures("host16")
def test_the_least_quota_up_the_v2_hierarchy_counts(tmp_path: Path) -> None:
    files = {
        "kubepods/pod1/cpu.max": "300000 100000\n",  # the pod's limit, above the container's
        "kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "cpu.max": "max 100000\n",
    }
    root, own = tree(tmp_path, "0::/kubepods/pod1/ctr\n", files)
    assert cores.cgroup_cpu_limit(root, own) == 3.0 and cores.usable_cores(root, own) == 3


@pytest.mark.usefixtures("host16")
def test_a_v1_container_whose_proc_names_the_hosts_path_reads_its_mount(tmp_path: Path) -> None:
    files = {"cpu,cpuacct/cpu.cfs_quota_us": "150000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    own = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    root, own_path = tree(tmp_path, own, files)
    assert cores.cgroup_cpu_limit(root, own_path) == 1.5 and cores.usable_cores(root, own_path) == 2


@pytest.mark.usefixtures("host16")
def test_no_quota_or_unreadable_files_leave_the_affinity(tmp_path: Path) -> None:
    root, own = tree(tmp_path, "0::/user.slice\n", {"user.slice/cpu.max": "max 100000\n"})
    assert cores.cgroup_cpu_limit(root, own) is None and cores.usable_cores(root, own) == 16
    v1 = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    root, own = tree(tmp_path / "v1", "3:cpu:/\n", v1)
    assert cores.usable_cores(root, own) == 16
    root, own = tree(tmp_path / "junk", "0::/\n", {"cpu.max": "lots\n"})
    assert cores.usable_cores(root, own) == 16
    missing = str(tmp_path / "absent")
    assert cores.usable_cores(missing, missing) == 16  # no /proc, no cgroup mount


def test_an_affinity_with_holes_counts_its_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _pid: {0, 3})  # taskset -c 0,3
    root, own = tree(tmp_path, "0::/\n", {"cpu.max": "800000 100000\n"})  # a quota above the affinity
    assert cores.affinity_cpus() == [0, 3] and cores.usable_cores(root, own) == 2


@pytest.fixture
def quota2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host16: None) -> None:
    """This process as in a container held to 2 CPUs' time on a 16-core host, for every default that reads it."""
    root, own = tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})
    monkeypatch.setattr(cores, "CGROUP_ROOT", root)
    monkeypatch.setattr(cores, "OWN_CGROUP", own)


@pytest.mark.usefixtures("quota2")
def test_the_engines_default_threads_follow_the_quota_not_torchs_host_count() -> None:
    m = tiny_model(seed=7)
    before = torch.get_num_threads()
    torch.set_num_threads(4)  # torch's default on a host with more cores than the quota allows
    try:
        engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=8)
        given = Engine(
            RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=8, threads=3
        )
    finally:
        torch.set_num_threads(before)
    try:
        assert engine.threads == 2 and engine.thread_control.max_threads == 2
        assert given.threads == 3  # a count asked for is kept
    finally:
        engine.close()
        given.close()


@pytest.mark.usefixtures("quota2")
def test_replicas_share_the_quotas_cores_not_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[dict[str, Any]] = []

    class Cluster:
        def __init__(self, path: str, replicas: int, **kwargs: Any) -> None:
            started.append(kwargs)

    monkeypatch.setattr("radixcache.runtime.cluster.cluster.ReplicaCluster", Cluster)
    monkeypatch.setattr("radixcache.runtime.cluster.front.ClusterEngine", lambda cluster, path: cluster)
    monkeypatch.setattr("radixcache.runtime.loading.resolve_model_path", lambda model: model)
    replicas_cli.cluster_engine("m", 2, "cache_aware", None, {})
    assert started[0]["threads"] == 1 and started[0]["cpus"] == 1.0 and started[0]["num_cpus"] == 2


def test_the_quota_names_the_counter_of_its_cgroups_cpu_time(tmp_path: Path) -> None:
    v2 = {"a/cpu.max": "200000 100000\n", "a/cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n"}
    root, own = tree(tmp_path, "0::/a\n", v2)
    quota = cores.cgroup_quota(root, own)
    assert quota is not None and quota.cpus == 2.0 and quota.used_s() == 2.5
    v1 = {  # cpu and cpuacct mounted apart, as on this machine
        "cpu/docker/abc/cpu.cfs_quota_us": "100000\n",
        "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpuacct/docker/abc/cpuacct.usage": "3000000000\n",
    }
    root, own = tree(tmp_path / "v1", "3:cpu:/docker/abc\n2:cpuacct:/docker/abc\n", v1)
    quota = cores.cgroup_quota(root, own)
    assert quota is not None and quota.cpus == 1.0 and quota.used_s() == 3.0
    assert cores.CpuQuota(1.0).used_s() is None


@pytest.mark.skipif(not LinuxProbe.available(), reason="Linux /proc only")
def test_a_containers_idle_cores_are_what_its_quota_leaves_not_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's /proc/stat shows its 16 cores idle while the container spends its whole 2-CPU quota: read as
    16 idle cores, the controller raised a dropped count back again and again (backing off up to a minute)."""
    monkeypatch.setattr(threads_module, "_affinity", lambda: list(range(16)))
    hz = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    root, own = tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})
    usage = Path(root) / "cpu.stat"

    def at(second: int, used_s: float) -> None:  # each host CPU idle all along; the cgroup has run `used_s`
        stat.write_text("\n".join([f"cpu{i} 1 0 1 {second * hz} 0 0 0 0 0 0" for i in range(16)] + [""]))
        usage.write_text(f"usage_usec {int(used_s * 1e6)}\nuser_usec 0\n")

    now = [0.0]
    at(0, 0.0)
    probe = LinuxProbe(stat=str(stat), quota=cores.cgroup_quota(root, own), clock=lambda: now[0])
    a = probe.read()
    now[0] = 1.0
    at(1, 2.0)  # the quota spent: no core to spare, whatever the host's are doing
    b = probe.read()
    assert b.idle - a.idle == pytest.approx(0.0)
    now[0] = 2.0
    at(2, 2.5)  # half a CPU ran: 1.5 CPUs of the quota left
    c = probe.read()
    assert c.idle - b.idle == pytest.approx(1.5)
    assert LinuxProbe(stat=str(stat)).read().idle == pytest.approx(16 * 2.0)  # no quota: the affinity's cores
    monkeypatch.setattr(cores, "CGROUP_ROOT", root)
    monkeypatch.setattr(cores, "OWN_CGROUP", own)
    assert threads_module.default_probe()._quota == cores.CpuQuota(2.0, usage)  # the engine's probe reads it


def test_grammar_masks_take_a_thread_pool_only_where_the_process_has_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixcache.runtime.engine.structured import PARALLEL_MASKS_FROM_CPUS, Masker

    monkeypatch.setattr(cores, "OWN_CGROUP", str(tmp_path / "absent"))  # no quota, whatever this machine's
    monkeypatch.setattr(cores, "CGROUP_ROOT", str(tmp_path / "absent"))
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _pid: {0, 1})  # taskset -c 0,1 on a 16-core host
    assert not Masker()._parallel
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _pid: set(range(PARALLEL_MASKS_FROM_CPUS)))
    assert Masker()._parallel
    root, own = tree(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})  # the same cores held to 2 CPUs' time
    monkeypatch.setattr(cores, "CGROUP_ROOT", root)
    monkeypatch.setattr(cores, "OWN_CGROUP", own)
    assert not Masker()._parallel
