"""A real ``torchrun --nproc_per_node=2`` (gloo, CPU) over moto_server: every sample of the
epoch exactly once across ranks and DataLoader workers, equal batch counts per rank."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from asyncloader.testing import MotoServer, S3TestServer, descendants, free_port

from .conftest import N_CLASSES, N_IMAGES, isolate_env


def _torchrun(script: Path, nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node=nproc script args...`` on 127.0.0.1, to its end."""
    launch = [
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
    ]
    return _job(script, [launch], *args)[0]


def _nodes(
    script: Path, nnodes: int, nproc: int, *args: str
) -> list[subprocess.CompletedProcess[str]]:
    """One job of ``nnodes`` "nodes" on this host: a torchrun each, ``nproc`` ranks per
    node, meeting at a c10d rendezvous on 127.0.0.1 (as nodes of a cluster do)."""
    endpoint = f"127.0.0.1:{free_port()}"
    launch = [
        f"--nnodes={nnodes}",
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id=job{free_port()}",
    ]
    return _job(script, [launch] * nnodes, *args)


def _job(
    script: Path, launches: list[list[str]], *args: str
) -> list[subprocess.CompletedProcess[str]]:
    """One torchrun per entry of ``launches`` (its own arguments), all at once, to the end.

    A job still running after ``HANG`` seconds (a normal one takes 10-30) fails the test
    with every process's stacks: each Python process of the job (torchrun, the ranks, their
    DataLoader workers) runs with faulthandler on and is sent SIGABRT, which makes it print
    all its threads' tracebacks to the job's stderr before it dies.
    """
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    env["PYTHONFAULTHANDLER"] = "1"
    # torchrun makes a log folder under the temporary folder and leaves it: the test's own.
    env["TMPDIR"] = str(script.parent)
    procs = [
        subprocess.Popen(
            [*cmd, *launch, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for launch in launches
    ]
    deadline = time.monotonic() + HANG
    done: list[subprocess.CompletedProcess[str]] = []
    try:
        for proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                stacks = []
                for p in procs:
                    if p.poll() is None:
                        job = [p.pid, *descendants(p.pid)]  # ranks: sessions of their own
                        _signal(job, signal.SIGABRT, pause=0.5)  # dumps not interleaved
                for p in procs:
                    try:
                        _, err = p.communicate(timeout=15)
                    except subprocess.TimeoutExpired:
                        _signal([p.pid, *descendants(p.pid)], signal.SIGKILL)
                        _, err = p.communicate()
                    stacks.append((err or "")[-12000:])
                raise AssertionError(
                    f"torchrun still running after {HANG} s; the job's stacks:\n"
                    + "\n".join(stacks)
                ) from None
            assert proc.returncode == 0, stderr[-4000:]
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                _signal([proc.pid, *descendants(proc.pid)], signal.SIGKILL)
                proc.communicate()
    return done


HANG = 90  # seconds: under the suite's per-test timeout, which would print only ours


def _signal(pids: list[int], sig: int, pause: float = 0.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        time.sleep(pause)


# The start of every job script here: each sample is the digest of its object's bytes (what
# arrives proves which object it was), and finish() gathers every rank's result into one
# JSON file and ends the job.
JOB_COMMON = """
import hashlib, json
import numpy as np
import torch.distributed as dist

def digest(data):
    d = hashlib.blake2b(bytes(data), digest_size=16).digest()
    return np.frombuffer(d, np.uint8).reshape(1, 1, 16).copy()

def names(images):
    return [bytes(row).hex() for row in images.reshape(len(images), 16).tolist()]

def finish(result, out):
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        json.dump(gathered, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()
"""


TWO_RANKS = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    import asyncloader as al
    from asyncloader import ShardConfig, Source, StoreConfig
    from asyncloader.torch import ImageDataset

    class Key:
        def __call__(self, key):
            return int(key.rsplit("_", 1)[1].split(".")[0])  # img_000123.jpg -> 123

    START = "forkserver"  # see main()

    def gather(mine):
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        return gathered

    def node(endpoint):
        # A default loader a rank, the first loaders of the job (the node's CPU budget).
        loader = al.ImageLoader("s3://data/train/", batch_size=8,
                                transform=al.RandomResizedCrop(32),
                                rank=dist.get_rank(), world_size=dist.get_world_size(),
                                store=al.StoreConfig(options={"endpoint_url": endpoint}))
        with loader:
            n = sum(len(labels) for _, labels in loader)
            stats = loader.stats()
            return {"samples": n, "workers": stats.decode_workers, "budget": stats.cpu_budget,
                    "engines": loader.engine_processes, "repr": repr(loader)}

    def view():
        rank = dist.get_rank()
        # Rank 1 waited longer; rank 0 delivered more.
        mine = {"wait_seconds": 0.5 + 2.0 * rank, "samples": 30.0 - 10.0 * rank, "skipped": 0.0}
        job = al.job_scalars(mine)
        # A group of rank 1 alone: its figures, and its global rank as the slowest.
        alone = dist.new_group([1])
        lone = al.job_scalars(mine, group=alone) if rank == 1 else None
        return {"mine": mine, "job": job, "lone": lone}

    def train(endpoint):
        result = {}
        # A case: the even rule, samples_per_epoch (57: odd, so pad and drop differ),
        # drop_last.
        cases = {"pad": ("pad", None, False), "drop": ("drop", None, False),
                 "pad-57": ("pad", 57, False), "drop-57-last": ("drop", 57, True)}
        for name, (even, per_epoch, last) in cases.items():
            ds = ImageDataset("s3://data/train/", batch_size=10, seed=1, labels=Key(),
                              shard=ShardConfig(even=even, drop_last=last),
                              samples_per_epoch=per_epoch,
                              store=StoreConfig(options={"endpoint_url": endpoint}))
            ds.set_epoch(3)
            dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=START)
            labels, batches = [], 0
            for _, lab in dl:
                labels += lab.tolist()
                batches += 1
            result[name] = gather({"labels": labels, "batches": batches, "len": len(ds),
                                   "dl_len": len(dl), "classes": list(ds.classes)})
        # Two sources (two class folders), listed once each for the job, agreed by the ranks.
        sources = [Source(f"s3://data/train/class_0{c}/", labels=Key()) for c in (0, 1)]
        ds = ImageDataset(sources, batch_size=6, seed=1,
                          store=StoreConfig(options={"endpoint_url": endpoint}))
        dl = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context=START)
        labels = [x for _, lab in dl for x in lab.tolist()]
        result["mix"] = gather(labels)
        return result

    def main():
        # One torchrun for the module's three tests: starting one takes seconds.
        dist.init_process_group("gloo")
        endpoint, out = sys.argv[1:3]
        nodes = node(endpoint)
        # The DataLoaders start their workers from a fork server, a process of one thread:
        # a fork of this rank (gloo's threads, the loaders it ran) once inherited a lock held
        # mid-operation, and its worker hung at birth (CPython 3.11.7, where gh-112275, a
        # fork while another thread holds the thread-state list's lock, is one such lock).
        # The server first imports what this rank has, so each worker starts as fast as a fork.
        packages = ("asyncloader", "aiobotocore", "botocore", "aiohttp", "diskcache", "PIL")
        have = sorted(m for m in sys.modules if m.split(".")[0] in packages)
        multiprocessing.set_forkserver_preload(["__main__", *have])
        result = {"node": gather(nodes), "view": gather(view()), "train": train(endpoint)}
        if dist.get_rank() == 0:
            json.dump(result, open(out, "w"))
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture(scope="module")
def two_ranks(moto: MotoServer, moto_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One job of 2 ranks over moto (:data:`TWO_RANKS`): each part's figures, every rank's."""
    folder = tmp_path_factory.mktemp("two-ranks")
    script = folder / "job.py"
    script.write_text(TWO_RANKS)
    out = folder / "ranks.json"
    with pytest.MonkeyPatch.context() as env:  # made before the tests' own environment
        isolate_env(env)
        _torchrun(script, 2, moto.endpoint, str(out))
    return json.loads(out.read_text())


@pytest.mark.slow
def test_torchrun_two_ranks(two_ranks: Any) -> None:
    result = dict(two_ranks["train"])
    mix = result.pop("mix")  # class folders 0 and 1: every image i with i % 4 < 2, once
    assert len(mix[0]) == len(mix[1])
    assert sorted(mix[0] + mix[1]) == [i for i in range(N_IMAGES) if i % N_CLASSES < 2]
    for case, ranks in result.items():
        assert len(ranks) == 2
        assert ranks[0]["batches"] == ranks[1]["batches"]  # no DDP hang
        assert len(ranks[0]["labels"]) == len(ranks[1]["labels"])
        # len(ImageDataset) and len(DataLoader): the batches each rank's DataLoader of 2
        # workers delivered.
        for r in ranks:
            assert r["len"] == r["dl_len"] == r["batches"], (case, r["len"], r["batches"])
            assert r["classes"] == []  # labels from a callable: numbers, no class names
        seen = ranks[0]["labels"] + ranks[1]["labels"]
        if case == "pad":
            assert set(seen) == set(range(N_IMAGES))  # N_IMAGES is even: nothing padded
            assert len(seen) == N_IMAGES
        elif case == "drop":
            assert len(seen) == len(set(seen)) == N_IMAGES
        elif case == "pad-57":
            assert len(seen) == 58 and ranks[0]["batches"] == 3  # 57 padded to 29 a rank
        else:
            assert len(seen) == 40 and ranks[0]["batches"] == 2  # 28 a rank, 2 whole batches
    assert sorted(result) == ["drop", "drop-57-last", "pad", "pad-57"]


ELASTIC_JOB = JOB_COMMON + textwrap.dedent(
    """
    import sys
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    import asyncloader as al
    from asyncloader import DecodeConfig, StoreConfig
    from asyncloader.torch import ImageDataset

    def mix(endpoint, rank, world):
        # Two sources by weight, bucketed, filtered (tests/test_buckets.py's mix), read in
        # the training process.
        url = [al.Source("s3://shapes/a/", weight=2), al.Source("s3://shapes/b/", weight=1)]
        return al.ImageLoader(url, batch_size=3, labels="idx", seed=9, samples_per_epoch=36,
                              buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
                              filters=[("score", ">=", 1)], rank=rank, world_size=world,
                              engine=al.EngineConfig(mode="inline"),
                              decode=DecodeConfig(workers=1),
                              store=StoreConfig(options={"endpoint_url": endpoint}))

    def batches_of(it):
        return [(list(x.shape), y.tolist()) for x, y in it]

    def main():
        endpoint, shapes, workers, first, out, stop = sys.argv[1:7]
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        ds = ImageDataset("s3://b/train/", batch_size=8, seed=7,
                          decode=DecodeConfig(hook=digest, sample_shape=(1, 1, 16), workers=1),
                          store=StoreConfig(options={"endpoint_url": endpoint}))
        ds.set_epoch(2)
        if first != "-":  # a job restarted on another layout: rank 0's saved state
            ds.load_state_dict(torch.load(first + ".state", weights_only=False))
        dl = StatefulDataLoader(ds, batch_size=None, num_workers=int(workers),
                                multiprocessing_context="fork")
        seen, batches = [], 0
        for images, _ in dl:
            seen += names(images)
            batches += 1
            if batches == int(stop):  # pre-empted here: the checkpoint is rank 0's state
                if rank == 0:
                    torch.save(dl.state_dict(), out + ".state")
                break
        result = {"seen": seen, "batches": batches}
        if first == "-":  # the mix read whole, then stopped after a batch a rank
            with mix(shapes, rank, world) as loader:
                loader.set_epoch(1)
                result["whole"] = batches_of(loader)
            with mix(shapes, rank, world) as loader:
                loader.set_epoch(1)
                result["head"] = batches_of([next(iter(loader))])
                if rank == 0:
                    torch.save(loader.state_dict(), out + ".mix.state")
        else:
            with mix(shapes, rank, world) as loader:
                loader.load_state_dict(torch.load(first + ".mix.state", weights_only=False))
                result["rest"] = batches_of(loader)
        finish(result, out)

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow
def test_a_job_stopped_on_two_ranks_of_two_workers_resumes_on_other_layouts(
    light_server: S3TestServer, jpeg_folder: Path, tmp_path: Path
) -> None:
    """torchrun with 2 ranks × 2 DataLoader workers (StatefulDataLoader) is stopped after 3
    batches per rank; rank 0's state restarts the job on 3 ranks × 1 worker and on 1 rank ×
    2 workers.  Each sample is the digest of its object's bytes: the stopped job and each
    restarted one together deliver every object of the epoch exactly once, with equal
    batch counts per rank.

    The same jobs read a bucketed, filtered two-source mix in the training process: whole,
    and stopped after a batch a rank (rank 0's state saved).  Restarted on 3 ranks and on
    1, they deliver the rest of the uninterrupted epoch: every batch one bucket, every
    sample the stopped job did not deliver and none it did, equal counts on every rank
    (whole batches repeated to even the ranks, fewer than a batch a rank).  The same with
    in-process ranks, and the uninterrupted order itself: tests/test_buckets.py."""
    import hashlib

    from .test_buckets import BUCKETS, put_shapes

    objects = {
        hashlib.blake2b(f.read_bytes(), digest_size=16).hexdigest()
        for f in jpeg_folder.rglob("*.jpg")
    }
    assert len(objects) == N_IMAGES == 96  # 96 = 2 ranks × 3 batches × 8 + 48 left
    sizes = [list(s) for s in BUCKETS.sizes]
    script = tmp_path / "job.py"
    script.write_text(ELASTIC_JOB)
    with S3TestServer(bucket="shapes") as shapes:
        put_shapes(shapes, "shapes")
        servers = (light_server.endpoint, shapes.endpoint)
        first = tmp_path / "first.json"
        _torchrun(script, 2, *servers, "2", "-", str(first), "3")
        ranks = json.loads(first.read_text())
        assert [r["batches"] for r in ranks] == [3, 3]
        consumed = [d for r in ranks for d in r["seen"]]
        assert len(consumed) == len(set(consumed)) == 48
        whole = [i for r in ranks for _, batch in r["whole"] for i in batch]
        mix_consumed = [i for r in ranks for _, batch in r["head"] for i in batch]
        assert {i % 5 for i in whole} <= {1, 2, 3, 4}  # the filter: score = i % 5 >= 1
        assert set(mix_consumed) <= set(whole) and len(mix_consumed) == 2 * 3
        assert all(r["head"] == r["whole"][:1] for r in ranks)  # as the whole epoch began
        # Each kept image's header read once in the job, for both ranks and their four
        # loaders (the job's store), and no filtered-out image's.
        _headers_read(shapes, 1)
        for nproc, workers in ((3, 1), (1, 2)):
            out = tmp_path / f"{nproc}x{workers}.json"
            _torchrun(script, nproc, *servers, str(workers), str(first), str(out), "0")
            ranks = json.loads(out.read_text())
            assert len({r["batches"] for r in ranks}) == 1, ranks  # equal batch counts: no hang
            rest = [d for r in ranks for d in r["seen"]]
            assert len(rest) == len(set(rest)) == 48, (nproc, workers)
            assert set(rest) | set(consumed) == objects, (nproc, workers)
            mixed = [r["rest"] for r in ranks]
            assert all(shape[-2:] in sizes for r in mixed for shape, _ in r)  # a bucket each
            assert len({len(r) for r in mixed}) == 1, mixed  # equal batch counts
            delivered = [i for r in mixed for _, batch in r for i in batch]
            assert set(delivered) | set(mix_consumed) == set(whole), nproc
            assert not set(delivered) & set(mix_consumed), nproc
            extra = Counter(delivered) - Counter(whole)  # whole batches repeated to even ranks
            assert sum(extra.values()) < nproc * 3, nproc
        _headers_read(shapes, 3)  # once more in each restarted job


def _headers_read(shapes: S3TestServer, times: int) -> None:
    """Each image of tests/test_buckets.py's mix whose score passes the filter had its
    header read ``times`` times (a range request), and none other."""
    from .test_buckets import N

    read = shapes.stats()["ranges_by_key"]
    for folder, base in (("a", 0), ("b", N)):
        for i in range(base, base + N):
            key = f"{folder}/{i:03d}.jpg"
            assert read.get(key, 0) == (times if i % 5 else 0), (key, read.get(key))


def test_default_loaders_of_a_node_share_its_cpus(two_ranks: Any) -> None:
    """Two ranks, each a default loader: their decode workers add up to no more than the
    CPUs this machine lets a process use, and each says where its count came from."""
    ranks = two_ranks["node"]
    cpus = len(os.sched_getaffinity(0))
    assert sum(r["workers"] for r in ranks) <= max(cpus, 2)
    assert sum(r["samples"] for r in ranks) == N_IMAGES
    for r in ranks:
        assert r["workers"] == max(1, cpus // 2 - (1 if cpus // 2 >= 3 else 0))
        assert r["budget"] == f"{cpus} CPUs shared by 2 ranks on this node (LOCAL_WORLD_SIZE)"
        assert f"decode_workers={r['workers']} (of {r['budget']})" in r["repr"]
        assert r["engines"] == 1


def test_the_job_s_view_of_each_figure_over_two_ranks(two_ranks: Any) -> None:
    """job_scalars under torchrun: every rank gets each figure's max and mean over the
    ranks and the rank that waited longest, the same on every rank."""
    ranks = two_ranks["view"]
    mine = [r["mine"] for r in ranks]
    for name in ("wait_seconds", "samples", "skipped"):
        values = [m[name] for m in mine]
        for r in ranks:
            assert r["job"][f"{name}/max"] == max(values)
            assert r["job"][f"{name}/mean"] == sum(values) / 2
    assert all(r["job"]["wait_seconds/slowest_rank"] == 1 for r in ranks)
    assert ranks[0]["job"] == ranks[1]["job"]
    lone = ranks[1]["lone"]
    assert lone["wait_seconds/max"] == lone["wait_seconds/mean"] == mine[1]["wait_seconds"]
    assert lone["wait_seconds/slowest_rank"] == 1  # the global rank, not 0 of its group
