"""What the process's environment says about where it runs (a leaf module): the CPUs it may
use (its affinity mask and its container's CPU quota), the ranks it shares its node with,
and its place in a ``torchrun`` job (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``LOCAL_RANK``; SLURM's and Ray Train's equivalents).  Read here only, so every part of the
package agrees."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._binding import Binding, cpus_said, job_of_node, node_masks

__all__ = [
    "in_dataloader_worker",
    "CpuBudget",
    "agent_store",
    "cgroup_cpu_quota",
    "cpu_budget",
    "local_rank",
    "local_world_size",
    "ranks_per_node",
    "shard_from_env",
    "usable_cpus",
]


def in_dataloader_worker() -> bool:
    """This process is a DataLoader worker (or another daemonic child of multiprocessing):
    a process of its own already, which its parent may terminate without warning, and
    which belongs to its parent's process group, not to one of its own."""
    import multiprocessing

    return bool(multiprocessing.current_process().daemon)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which ``taskset`` and container
    CPU sets narrow), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _int(name: str) -> int | None:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else None
    except ValueError:
        return None


def shard_from_env() -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)`` from the torchrun environment (0 and 1 where unset), or
    ``(0, 1)`` when either is not a number."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def agent_store() -> tuple[str, int, str] | None:
    """``(host, port, key prefix)`` of torchrun's agent store where the environment names
    one (``TORCHELASTIC_USE_AGENT_STORE``, ``MASTER_ADDR``, ``MASTER_PORT``), its prefix
    naming the run and its restart (``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``),
    so that a restarted job starts afresh; else None."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return None
    run = env.get("TORCHELASTIC_RUN_ID", "none")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return host, int(port), f"asyncloader/{run}/{restart}"


def local_world_size() -> int | None:
    """Ranks per node (``LOCAL_WORLD_SIZE`` under torchrun), or None."""
    return _int("LOCAL_WORLD_SIZE")


def local_rank() -> int | None:
    """This rank's index on its node (``LOCAL_RANK`` under torchrun, ``SLURM_LOCALID``
    under ``srun``), or None."""
    found = _int("LOCAL_RANK")
    return found if found is not None else _int("SLURM_LOCALID")


def ranks_per_node() -> tuple[int | None, str]:
    """Ranks on this node and who says so: ``LOCAL_WORLD_SIZE`` (torchrun; Ray Train's
    workers have it too), else SLURM's tasks per node under ``srun`` (``SLURM_NTASKS_PER_NODE``,
    or the first count of ``SLURM_TASKS_PER_NODE``, as in ``4(x2)``); ``(None, "")`` where
    nothing says."""
    local = _int("LOCAL_WORLD_SIZE")
    if local:
        return local, "LOCAL_WORLD_SIZE"
    if os.environ.get("SLURM_LOCALID", "") != "":
        for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            head = os.environ.get(name, "").split("(")[0].split(",")[0]
            if head.isdigit() and int(head) > 0:
                return int(head), name
    return None, ""


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/") -> float | None:
    """The CPU quota of this process's control groups, in CPUs (``quota / period``; the
    smallest along the group's path), or None where none is set or none can be read.

    cgroup v2 (``cpu.max``) and v1 (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), each
    found where ``/proc/self/mountinfo`` mounts it: a Kubernetes pod limited to 8 CPUs on a
    96-core host has 8 here and 96 in its affinity mask.  ``root``: where ``/proc`` and the
    mounts are read from (``/`` but in tests).
    """
    base = Path(root)
    try:
        groups = (base / "proc/self/cgroup").read_text().splitlines()
        mounts = (base / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    paths: dict[str, str] = {}  # "v2" or "v1" -> this process's group path
    for line in groups:
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and controllers == "":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    quotas = []
    for line in mounts:
        mount, sep, tail = line.partition(" - ")
        fields, fs = mount.split(), tail.split()
        if not sep or len(fields) < 5 or len(fs) < 3:
            continue
        mount_root, mount_point, kind, options = fields[3], fields[4], fs[0], fs[2]
        if kind == "cgroup2" and "v2" in paths:
            quotas += _quotas_along(base, mount_root, mount_point, paths["v2"], _v2_quota)
        elif kind == "cgroup" and "cpu" in options.split(",") and "v1" in paths:
            quotas += _quotas_along(base, mount_root, mount_point, paths["v1"], _v1_quota)
    return min(quotas) if quotas else None


def _quotas_along(
    base: Path,
    mount_root: str,
    mount_point: str,
    path: str,
    read: Callable[[Path], float | None],
) -> list[float]:
    """The quotas set on the group's folder and each folder above it in that mount."""
    rel = path[len(mount_root) :] if path.startswith(mount_root) else path
    folder = base / mount_point.lstrip("/") / rel.strip("/")
    top = base / mount_point.lstrip("/")
    out = []
    while True:
        quota = read(folder)
        if quota is not None:
            out.append(quota)
        if folder == top or top not in folder.parents:
            return out
        folder = folder.parent


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


@dataclass(frozen=True, slots=True)
class CpuBudget:
    """The CPUs this process may use, and the ranks of its node that share them.

    Attributes:
        affinity: CPUs in its affinity mask.
        quota: Its container's CPU quota [CPUs], or None.
        ranks: Ranks on this node (1 where nothing says).
        ranks_from: Who says so (``"LOCAL_WORLD_SIZE"``, ``"ShardConfig"``, ...; "" for 1).
        binding: How its mask relates to the other local ranks' masks (a launcher that
            binds each rank to CPUs of its own), where they could be known; None: not
            known, the CPUs are split evenly among the ranks.
    """

    affinity: int
    quota: float | None
    ranks: int
    ranks_from: str
    binding: Binding | None = None

    @property
    def cpus(self) -> int:
        """The CPUs it may use: the affinity mask or the quota, whichever is smaller (a
        quota's fraction of a CPU does not count), at least 1."""
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.floor(self.quota + 1e-9)))

    @property
    def per_rank(self) -> int:
        """This rank's share of the node's CPUs, at least 1: its mask's CPUs, each split
        among the local ranks whose masks hold it (:class:`~._binding.Binding`), within its
        share of the container's quota; without the other ranks' masks, the CPUs divided by
        the ranks."""
        b = self.binding
        if b is None or b.kind == "unknown":
            return max(1, self.cpus // self.ranks)
        share = b.share if self.quota is None else min(b.share, self.quota / self.ranks)
        return max(1, math.floor(share + 1e-9))

    def decode_workers(self, dataloader_workers: int = 1) -> int:
        """The default decode workers of a loader: this rank's share, less a core of its own
        for the training process where the share is 3 CPUs or more, divided among its
        DataLoader workers, at least 1.  On 2 cores one rank decodes on both (2 decode
        workers beside the trainer made 1.12x one engine thread's images/s; its CPU per
        image 0.02 ms: bench_neighbour, bench_loader); from 3 CPUs a rank keeps one for its
        training step, a guess a 2-core machine cannot measure."""
        share = self.per_rank - 1 if self.per_rank >= 3 else self.per_rank
        return max(1, share // max(dataloader_workers, 1))

    def describe(self) -> str:
        """Where the numbers come from, in a few words."""
        b = self.binding
        if b is not None and b.kind in ("own", "overlapping") and self.ranks > 1:
            said = b.describe(self.affinity, self.ranks, self.ranks_from)
            quota = self.quota is not None and self.quota / self.ranks < b.share
            return said + (f", within the container's quota of {self.quota:g}" if quota else "")
        if self.quota is not None and self.quota < self.affinity:
            cpus = (
                f"{cpus_said(self.cpus)} (the container's quota of {self.quota:g} of "
                f"{self.affinity})"
            )
        else:
            cpus = cpus_said(self.cpus)
        if self.ranks == 1:
            return cpus
        return f"{cpus} shared by {self.ranks} ranks on this node ({self.ranks_from})"


def cpu_budget(ranks: int | None = None) -> CpuBudget:
    """This process's CPU budget; ``ranks``: the node's rank count when the caller knows it
    (``ShardConfig(local_world_size=)``), else the environment says it.  With several
    ranks on the node, a job that names itself (torchrun, SLURM) and a local rank, the
    ranks tell each other their masks (:mod:`._binding`): a launcher's binding counts."""
    if ranks is not None:
        found, source = max(ranks, 1), "ShardConfig"
    else:
        counted, source = ranks_per_node()
        found = counted or 1
    binding = None
    job, me = job_of_node(), local_rank()
    if found > 1 and job is not None and me is not None and 0 <= me < found:
        mine = _affinity()
        binding = Binding(me, node_masks(job, me, found, mine), found)
    return CpuBudget(usable_cpus(), cgroup_cpu_quota(), found, source, binding)


def _affinity() -> set[int]:
    """The CPUs of this process's affinity mask (all of them where it cannot be read)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))
