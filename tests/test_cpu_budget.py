"""One CPU budget per node (``_base/_env.py``): the CPUs a process may use are its affinity
mask or its container's quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), whichever is
smaller; the default decode workers share them among the node's ranks and each rank's
DataLoader workers.  The cgroup files are laid out as the kernel shows them, under a folder
of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncloader._base._env import CpuBudget, cgroup_cpu_quota, cpu_budget, ranks_per_node
from asyncloader._loader._launch import SINGLE_THREADED


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_kubernetes_pod_on_cgroup_v2_has_its_limit_and_its_parents(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
            "/proc/self/mountinfo": V2_MOUNT,
            "/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "800000 100000\n",
            "/sys/fs/cgroup/kubepods/pod1/cpu.max": "600000 100000\n",  # the pod's: smaller
            "/sys/fs/cgroup/kubepods/cpu.max": "max 100000\n",
        },
    )
    assert cgroup_cpu_quota(root) == 6.0


def test_no_limit_is_none(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "0::/user.slice\n",
            "/proc/self/mountinfo": V2_MOUNT,
            "/sys/fs/cgroup/user.slice/cpu.max": "max 100000\n",
        },
    )
    assert cgroup_cpu_quota(root) is None
    assert cgroup_cpu_quota(tmp_path / "nothing-here") is None  # no /proc: no quota


def test_a_docker_container_on_cgroup_v1(tmp_path: Path) -> None:
    # Without a cgroup namespace the container's own group is the mount's root.
    root = _tree(
        tmp_path,
        {
            "/proc/self/cgroup": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
            "/proc/self/mountinfo": "41 33 0:36 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - "
            "cgroup cgroup rw,cpu,cpuacct\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroup_cpu_quota(root) == 1.5
    unlimited = _tree(
        tmp_path / "b",
        {
            "/proc/self/cgroup": "4:cpu,cpuacct:/\n",
            "/proc/self/mountinfo": "41 33 0:36 / /sys/fs/cgroup/cpu,cpuacct ro - "
            "cgroup cgroup rw,cpu,cpuacct\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroup_cpu_quota(unlimited) is None


@pytest.mark.parametrize(
    ("affinity", "quota", "ranks", "dataloader_workers", "cpus", "workers"),
    [
        (2, None, 1, 1, 2, 2),  # this machine, one rank: both cores decode
        (2, None, 2, 1, 2, 1),  # two ranks on 2 cores: one each, 2 in all
        (96, 8.0, 8, 1, 8, 1),  # a pod limited to 8 CPUs on a 96-core host, 8 ranks
        (96, None, 8, 1, 96, 11),  # 12 CPUs a rank, one kept for its training step
        (96, None, 8, 4, 96, 2),  # ... shared by 4 DataLoader workers
        (16, 2.5, 1, 1, 2, 2),  # a fraction of a CPU does not count
        (4, 0.5, 1, 1, 1, 1),  # at least one
    ],
)
def test_the_default_decode_workers_share_the_budget(
    affinity: int,
    quota: float | None,
    ranks: int,
    dataloader_workers: int,
    cpus: int,
    workers: int,
) -> None:
    budget = CpuBudget(affinity, quota, ranks, "LOCAL_WORLD_SIZE")
    assert budget.cpus == cpus
    assert budget.decode_workers(dataloader_workers) == workers
    assert budget.decode_workers(dataloader_workers) * ranks * dataloader_workers <= max(
        cpus, ranks * dataloader_workers
    )


def test_the_budget_says_where_it_comes_from() -> None:
    assert CpuBudget(2, None, 1, "").describe() == "2 CPUs"
    assert CpuBudget(96, 8.0, 8, "LOCAL_WORLD_SIZE").describe() == (
        "8 CPUs (the container's quota of 8 of 96) shared by 8 ranks on this node "
        "(LOCAL_WORLD_SIZE)"
    )


def test_the_node_s_ranks_from_torchrun_slurm_or_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_TASKS_PER_NODE", raising=False)
    assert ranks_per_node() == (None, "")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2)")
    assert ranks_per_node() == (None, "")  # not under srun
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert ranks_per_node() == (4, "SLURM_TASKS_PER_NODE")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert ranks_per_node() == (8, "LOCAL_WORLD_SIZE")
    assert cpu_budget().ranks == 8
    assert cpu_budget(ranks=2).ranks_from == "ShardConfig"


def test_children_run_numeric_libraries_single_threaded() -> None:
    from asyncloader._loader._launch import launch

    # A child started the loader's way sees one thread for each numeric library.
    proc, conn = launch("tests._child_env:report", "asyncloader-test", None)
    try:
        assert conn.poll(60)
        seen = conn.recv()
    finally:
        conn.close()
        proc.wait(30)
    assert {k: seen.get(k) for k in SINGLE_THREADED} == SINGLE_THREADED
