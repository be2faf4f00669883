"""The CPU budget under a launcher's binding (``_base/_binding.py``): each rank's share is its
mask's CPUs, each split among the local ranks whose masks hold it — the whole mask where a
launcher binds ranks to CPUs of their own (SLURM ``--cpu-bind``, numactl, torchrun's NUMA
binding), an even split where they all share one mask — told to each other through a
node-local folder; and under torchrun with ranks bound by ``taskset``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncloader._base import _binding
from asyncloader._base._binding import Binding, job_of_node, node_masks, share_of
from asyncloader._base._env import CpuBudget

masks_st = st.lists(st.frozensets(st.integers(0, 15), min_size=1), min_size=1, max_size=8)


@given(masks_st)
def test_the_shares_of_the_node_s_ranks_add_up_to_the_cpus_they_hold(
    masks: list[frozenset[int]],
) -> None:
    by_rank = dict(enumerate(masks))
    total = sum(share_of(m, by_rank) for m in masks)
    assert total == pytest.approx(len(frozenset().union(*masks)))
    for m in masks:
        assert 0 < share_of(m, by_rank) <= len(m)


@given(st.frozensets(st.integers(0, 63), min_size=1), st.integers(1, 8))
def test_identical_masks_split_evenly(mask: frozenset[int], ranks: int) -> None:
    by_rank = dict.fromkeys(range(ranks), mask)
    assert share_of(mask, by_rank) == pytest.approx(len(mask) / ranks)


def test_eight_slurm_tasks_bound_to_twelve_cores_each_get_twelve() -> None:
    """The issue's node: 96 cores, 8 tasks of 12 bound cores each.  Divided again by the 8
    ranks each would get one; knowing the binding, each keeps its 12 (11 decode workers
    beside its training step)."""
    masks = {r: set(range(12 * r, 12 * r + 12)) for r in range(8)}
    binding = Binding(3, masks, 8)
    assert binding.kind == "own" and binding.share == 12
    budget = CpuBudget(12, None, 8, "SLURM_NTASKS_PER_NODE", binding)
    assert budget.per_rank == 12 and budget.decode_workers() == 11
    assert budget.describe() == (
        "12 CPUs bound to this rank alone (8 ranks on this node, SLURM_NTASKS_PER_NODE)"
    )
    # Without the binding known, as before: the mask divided among the node's ranks.
    assert CpuBudget(12, None, 8, "SLURM_NTASKS_PER_NODE").per_rank == 1


def test_identical_overlapping_and_unheard_masks() -> None:
    every = set(range(16))
    shared = Binding(0, dict.fromkeys(range(4), every), 4)
    assert shared.kind == "shared" and shared.share == 4
    budget = CpuBudget(16, None, 4, "LOCAL_WORLD_SIZE", shared)
    assert budget.per_rank == 4
    assert budget.describe() == "16 CPUs shared by 4 ranks on this node (LOCAL_WORLD_SIZE)"
    overlap = Binding(0, {0: set(range(8)), 1: set(range(4, 12))}, 2)
    assert overlap.kind == "overlapping" and overlap.share == 6  # 4 alone, 4 halved
    said = CpuBudget(8, None, 2, "LOCAL_WORLD_SIZE", overlap).describe()
    assert said == (
        "6.0 of the 8 CPUs bound to this rank (the masks of the node's 2 ranks overlap, "
        "LOCAL_WORLD_SIZE)"
    )
    # Ranks not heard from share this rank's whole mask: never more than its due, and the
    # split is the even one of before binding was known.
    alone = Binding(0, {0: set(range(8))}, 4)
    assert alone.kind == "unknown" and alone.share == 2
    assert CpuBudget(8, None, 4, "LOCAL_WORLD_SIZE", alone).per_rank == 2
    half = Binding(0, {0: set(range(8)), 1: set(range(8, 16))}, 4)
    assert half.kind == "unknown" and half.share == pytest.approx(8 / 3)
    assert CpuBudget(8, None, 4, "LOCAL_WORLD_SIZE", half).per_rank == 2


def test_a_container_quota_still_bounds_a_bound_rank() -> None:
    masks = {r: set(range(12 * r, 12 * r + 12)) for r in range(8)}
    budget = CpuBudget(12, 32.0, 8, "LOCAL_WORLD_SIZE", Binding(0, masks, 8))
    assert budget.per_rank == 4  # the quota of 32 CPUs for 8 ranks
    assert budget.describe().endswith(", within the container's quota of 32")


def test_the_job_on_the_node_is_named_by_torchrun_or_slurm() -> None:
    assert job_of_node({}) is None
    env = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert job_of_node(env) == "torch-abc-2"
    assert job_of_node({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "1"}) == "slurm-77-1"


RANK = textwrap.dedent(
    """
    import json, sys
    from asyncloader._base._binding import node_masks
    job, rank, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    got = node_masks(job, rank, 3, {2 * rank, 2 * rank + 1}, wait=wait)
    print(json.dumps({str(r): sorted(m) for r, m in got.items()}))
    """
)


def _ranks(tmp_path: Path, job: str, ranks: range, wait: float) -> list[dict[str, list[int]]]:
    """``node_masks`` in one process per rank, all at once, the temporary folder ours."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, job, str(r), str(wait)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in ranks
    ]
    return [json.loads(p.communicate(timeout=60)[0]) for p in procs]


def test_ranks_tell_each_other_their_masks_through_a_node_local_folder(tmp_path: Path) -> None:
    want = {str(r): [2 * r, 2 * r + 1] for r in range(3)}
    assert _ranks(tmp_path, "job-a", range(3), wait=30.0) == [want] * 3
    # A later process of the job reads them at once; another job reads none of them.
    assert _ranks(tmp_path, "job-a", range(1, 2), wait=0.0) == [want]
    assert _ranks(tmp_path, "job-b", range(1, 2), wait=0.0) == [{"1": [2, 3]}]
    # Rank 2's mask, and the process that wrote it (one of the rank's, ended since).
    mask, writer, end = (tmp_path / "asyncloader-cpus-job-a" / "2").read_text().split("\n")
    assert (mask, end) == ("4,5", "") and int(writer) != os.getpid()


def _ended_pid() -> int:
    """The number of a process that has ended (and been waited for)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def _job_folder(tmp: Path, name: str, body: str | None, age: float) -> Path:
    """A job's folder as ``node_masks`` leaves it (rank 0's file holding ``body``, or no
    file), last written ``age`` seconds ago."""
    folder = tmp / f"asyncloader-cpus-{name}"
    folder.mkdir()
    if body is not None:
        (folder / "0").write_text(body)
    then = time.time() - age
    os.utime(folder, (then, then))
    return folder


def test_earlier_jobs_folders_go_once_unwritten_for_an_hour_and_their_writers_ended(
    tmp_path: Path,
) -> None:
    ended, hours = _ended_pid(), 2 * 3600.0
    _job_folder(tmp_path, "done", f"0,1\n{ended}\n", hours)
    _job_folder(tmp_path, "before-writers-were-named", "0,1", hours)
    _job_folder(tmp_path, "empty", None, hours)
    _job_folder(tmp_path, "running", f"0,1\n{os.getpid()}\n", hours)  # a live writer
    _job_folder(tmp_path, "just-ended", f"0,1\n{ended}\n", 60.0)  # written a minute ago
    _job_folder(tmp_path, "this-one", f"0,1\n{ended}\n", hours)
    (tmp_path / "other-old").mkdir()  # not a job's folder
    os.utime(tmp_path / "other-old", (0, 0))
    (tmp_path / "asyncloader-cpus-a-file").write_text("0,1")  # not a folder
    os.utime(tmp_path / "asyncloader-cpus-a-file", (0, 0))
    removed = _binding.sweep(tmp_path, "asyncloader-cpus-this-one")
    assert sorted(removed) == [
        "asyncloader-cpus-before-writers-were-named",
        "asyncloader-cpus-done",
        "asyncloader-cpus-empty",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "asyncloader-cpus-a-file",
        "asyncloader-cpus-just-ended",
        "asyncloader-cpus-running",
        "asyncloader-cpus-this-one",
        "other-old",
    ]


def test_the_first_process_of_a_job_on_the_node_sweeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making its job's folder, a process removes a done job's; a later process of the
    same job (the folder there) does not sweep."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(_binding, "_waited", set())
    ended = _ended_pid()
    _job_folder(tmp_path, "done", f"0\n{ended}\n", 7200.0)
    assert node_masks("job-d", 0, 1, {0}) == {0: {0}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["asyncloader-cpus-job-d"]
    _job_folder(tmp_path, "done-later", f"0\n{ended}\n", 7200.0)
    assert node_masks("job-d", 1, 2, {1}, wait=0.0) == {0: {0}, 1: {1}}
    assert (tmp_path / "asyncloader-cpus-done-later").is_dir()


def test_a_process_waits_for_the_others_once_per_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(_binding, "_waited", set())
    t0 = time.monotonic()
    assert node_masks("job-c", 0, 2, {0}, wait=0.3) == {0: {0}}  # rank 1 never comes
    assert time.monotonic() - t0 >= 0.3
    t0 = time.monotonic()
    assert node_masks("job-c", 0, 2, {0}, wait=0.3) == {0: {0}}
    assert time.monotonic() - t0 < 0.3


SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import asyncloader as al
    if __name__ == "__main__":
        endpoint, out = sys.argv[1:3]
        with al.ImageLoader("s3://b/train/", batch_size=8, transform=al.CenterCrop(16),
                            rank=int(os.environ["RANK"]), world_size=2,
                            store=al.StoreConfig(options={"endpoint_url": endpoint})) as loader:
            n = sum(len(labels) for _, labels in loader)
            stats = loader.stats()
        mask = sorted(os.sched_getaffinity(0))
        json.dump({"samples": n, "budget": stats.cpu_budget, "mask": mask,
                   "workers": stats.decode_workers},
                  open(f"{out}.{os.environ['LOCAL_RANK']}", "w"))
    """
)


@pytest.mark.parametrize("bound", ["disjoint", "same"])
def test_ranks_bound_by_taskset_under_torchrun(
    light_server: object, tmp_path: Path, bound: str
) -> None:
    """Two ranks, each bound by taskset to a CPU of its own, or both to the same two."""
    if shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    if bound == "disjoint":  # rank r on a CPU of its own, as a launcher's --cpu-bind does
        pin = f"$(( LOCAL_RANK == 0 ? {cpus[0]} : {cpus[1]} ))"
    else:
        pin = f"{cpus[0]},{cpus[1]}"
    inner = f'exec taskset -c {pin} "{sys.executable}" "{script}" "$0" "{out}"'
    endpoint = light_server.endpoint  # type: ignore[attr-defined]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "--no-python",
            "sh",
            "-c",
            inner,
            endpoint,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    assert sum(r["samples"] for r in ranks) > 0
    for r in ranks:
        if bound == "disjoint":
            assert len(r["mask"]) == 1
            assert r["budget"] == (
                "1 CPU bound to this rank alone (2 ranks on this node, LOCAL_WORLD_SIZE)"
            )
        else:
            assert len(r["mask"]) == 2
            assert r["budget"] == "2 CPUs shared by 2 ranks on this node (LOCAL_WORLD_SIZE)"
        assert r["workers"] == 1
    if bound == "disjoint":
        assert ranks[0]["mask"] != ranks[1]["mask"]
