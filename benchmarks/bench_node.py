"""A training node: ``torchrun --standalone --nproc_per_node=N``, every rank a default
loader over one store, against the node's stock ceiling measured in the same run.

Cases, each a whole torchrun job (rounds interleave them; medians are printed):

* ``loader`` — every rank a default ``ImageLoader`` (no ``decode_workers``: the node's CPU
  budget shared among its ranks), its shard of the epoch.
* ``bound`` (``--bind K``) — the same, every rank bound by ``taskset`` to K CPUs of its
  own, as a launcher's CPU binding does (SLURM's ``--cpu-bind``): each rank's budget
  should be its K CPUs, not K ÷ N; the ranks' ``cpu_budget`` lines are printed.
* ``dataset`` (``--dataset``) — every rank an ``ImageDataset`` in a ``DataLoader`` of
  ``--dataloader-workers`` workers.
* ``ceiling`` — the node's stock ceiling: every rank a stock ``DataLoader`` with the
  node's CPUs ÷ N workers, decoding its shard's bytes from RAM (Pillow, the whole image,
  RandomResizedCrop(224): as the peers decode), no store at all.

Printed per case: the node's images/s (all ranks' images over the slowest rank's time) and
its ratio to the ceiling, the most threads and processes the job ran at once (every process
below torchrun), the trainers' CPU per image (the rank processes alone), the largest peak
RSS of a rank with its largest child, and the slowest rank's first batch.  The store is our
light S3 server with ``--latency`` to the first byte.

Run: ``python benchmarks/bench_node.py [--nproc 2] [--latency 0.02] [--repeat 3] [--bind K]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_loader as bl  # noqa: E402  (the ceiling's decode, the folder)

BATCH = 128


# --- one rank (run by torchrun) ----------------------------------------------------------


def _rank(
    case: str, endpoint: str, folder: Path, epochs: int, loader_workers: int, out: str
) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    start = time.perf_counter()
    if case == "ceiling":
        res = _ceiling(folder, rank, world, epochs)
    else:
        res = _loader(case, endpoint, rank, world, epochs, loader_workers, start)
        res["mask"] = sorted(os.sched_getaffinity(0))
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    res["rss_mb"] = (usage + kids) / 1024  # with its largest child, as bench_loader counts
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, res)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def _loader(
    case: str,
    endpoint: str,
    rank: int,
    world: int,
    epochs: int,
    loader_workers: int,
    start: float,
) -> dict[str, Any]:
    import torch.distributed as dist

    import asyncloader as al

    options: dict[str, Any] = {
        "batch_size": BATCH,
        "transform": al.RandomResizedCrop(224),
        "store": al.StoreConfig(options={"endpoint_url": endpoint}),
    }
    budget = ""
    if case in ("loader", "bound"):
        source: Any = al.ImageLoader("s3://b/train/", rank=rank, world_size=world, **options)
        workers = source.stats().decode_workers
        budget = source.stats().cpu_budget
    else:
        from torch.utils.data import DataLoader

        from asyncloader.torch import ImageDataset

        dataset = ImageDataset("s3://b/train/", **options)
        source = DataLoader(dataset, batch_size=None, num_workers=loader_workers)
        workers = loader_workers
    first = 0.0
    for _ in source:  # epoch 0: start-up, connections
        first = first or time.perf_counter() - start
    dist.barrier()  # the ranks measure together
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for _ in range(epochs):
        if case == "dataset":
            dataset.set_epoch(dataset.epoch + 1)
        n += sum(len(labels) for _, labels in source)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if case != "dataset":
        source.close()
    return {
        "images": n,
        "wall": wall,
        "trainer_cpu": cpu,
        "first": first,
        "workers": workers,
        "budget": budget,
    }


def _ceiling(folder: Path, rank: int, world: int, epochs: int) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    from asyncloader import RandomResizedCrop
    from asyncloader._decode import DecodeSpec, decode_into

    datas = [p.read_bytes() for p in bl._files(folder)][rank::world]
    workers = max(1, len(os.sched_getaffinity(0)) // world)
    # The whole image through Pillow, as the peers decode (not our region decode).
    spec = DecodeSpec((3, 224, 224), RandomResizedCrop(224), roi=False)

    class InRam(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return len(datas)

        def __getitem__(self, i: int) -> torch.Tensor:
            out = np.empty((3, 224, 224), np.uint8)
            decode_into(datas[i], out, spec, i, "k")
            return torch.from_numpy(out)

    loader = DataLoader(InRam(), batch_size=BATCH, shuffle=True, num_workers=workers)
    start = time.perf_counter()
    first = 0.0
    for batch in loader:  # workers started, pages warm
        del batch  # none kept: each slot goes back at once
        first = first or time.perf_counter() - start
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(x) for _ in range(epochs) for x in loader)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"images": n, "wall": wall, "trainer_cpu": cpu, "first": first, "workers": workers}


# --- the driver -------------------------------------------------------------------------


def _watch(root: int, stop: threading.Event, peak: dict[str, int]) -> None:
    """Every 0.2 s: the processes below ``root`` and their threads, the most at once."""
    from asyncloader.testing import descendants

    while not stop.wait(0.2):
        pids = descendants(root)
        threads = 0
        for pid in pids:
            try:
                threads += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
        peak["processes"] = max(peak.get("processes", 0), len(pids))
        peak["threads"] = max(peak.get("threads", 0), threads)


def _job(args: argparse.Namespace, case: str, endpoint: str, folder: Path) -> dict[str, Any]:
    torchrun = shutil.which("torchrun")
    assert torchrun is not None, "torchrun is not on PATH"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ranks.json"
        rank_args = [case, endpoint, str(folder), str(args.epochs)]
        rank_args += [str(args.dataloader_workers), str(out)]
        cmd = [torchrun, "--standalone", f"--nproc_per_node={args.nproc}"]
        if case == "bound":  # each rank on K CPUs of its own, by LOCAL_RANK
            cpus = sorted(os.sched_getaffinity(0))
            k = args.bind
            pins = " ".join(
                f"{r}) C={','.join(map(str, cpus[k * r : k * (r + 1)]))};;"
                for r in range(args.nproc)
            )
            inner = f'case $LOCAL_RANK in {pins} esac; exec taskset -c $C "$0" "$@"'
            cmd += ["--no-python", "sh", "-c", inner, sys.executable, __file__]
        else:
            cmd += [__file__]
        cmd += ["--rank-case", *rank_args]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stop, peak = threading.Event(), {}
        watcher = threading.Thread(target=_watch, args=(proc.pid, stop, peak))
        watcher.start()
        _, err = proc.communicate(timeout=1800)
        stop.set()
        watcher.join()
        if proc.returncode != 0:
            raise RuntimeError(err[-4000:])
        ranks = json.loads(out.read_text())
    images = sum(r["images"] for r in ranks)
    return {
        "images_per_s": images / max(r["wall"] for r in ranks),
        "trainer_cpu_ms": sum(r["trainer_cpu"] for r in ranks) / images * 1e3,
        "rss_mb": max(r["rss_mb"] for r in ranks),
        "first_s": max(r["first"] for r in ranks),
        "workers": [r["workers"] for r in ranks],
        "budgets": sorted({r.get("budget", "") for r in ranks}),
        "masks": [r.get("mask", []) for r in ranks],
        **peak,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks on the node")
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--epochs", type=int, default=2, help="epochs measured per job")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dataset", action="store_true", help="also ImageDataset in a DataLoader")
    p.add_argument("--dataloader-workers", type=int, default=1)
    p.add_argument(
        "--bind", type=int, default=0, metavar="K", help="also every rank bound to K CPUs"
    )
    p.add_argument("--data-dir", default=str(HERE.parent / "cache" / "bench-jpegs"))
    p.add_argument("--json", metavar="PATH", help="also write every round and the medians")
    p.add_argument("--rank-case", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_case:
        case, endpoint, folder, epochs, workers, out = args.rank_case
        _rank(case, endpoint, Path(folder), int(epochs), int(workers), out)
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(Path(args.data_dir), images=args.images, classes=10, seed=0)
    if args.bind and (
        shutil.which("taskset") is None or args.bind * args.nproc > len(os.sched_getaffinity(0))
    ):
        sys.exit(f"--bind {args.bind}: needs taskset and {args.bind * args.nproc} CPUs")
    cases = ["loader", *(["bound"] if args.bind else [])]
    cases += [*(["dataset"] if args.dataset else []), "ceiling"]
    rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    with S3TestServer(latency=args.latency, load=folder, bucket="b", prefix="train/") as srv:
        for r in range(args.repeat):
            for case in cases if r % 2 == 0 else cases[::-1]:
                res = _job(args, case, srv.endpoint, folder)
                rounds[case].append(res)
                print(case, json.dumps(res), flush=True)
    med = statistics.median
    ceiling = med(x["images_per_s"] for x in rounds["ceiling"])
    cpus = len(os.sched_getaffinity(0))
    print(
        f"\n{args.nproc} ranks on {cpus} CPUs, {args.images} JPEGs, batch {BATCH}, "
        f"{args.latency * 1e3:.0f} ms, {args.repeat} rounds; medians\n"
    )
    print(
        f"{'case':8s} {'node img/s':>10s} {'x ceiling':>9s} {'threads':>7s} {'procs':>5s} "
        f"{'trainer CPU ms/img':>18s} {'peak RSS MB':>11s} {'first s':>7s}  decode workers"
    )
    for case, rs in rounds.items():
        rate = med(x["images_per_s"] for x in rs)
        print(
            f"{case:8s} {rate:10.0f} {rate / ceiling:9.2f} "
            f"{med(x.get('threads', 0) for x in rs):7.0f} "
            f"{med(x.get('processes', 0) for x in rs):5.0f} "
            f"{med(x['trainer_cpu_ms'] for x in rs):18.3f} {med(x['rss_mb'] for x in rs):11.0f} "
            f"{med(x['first_s'] for x in rs):7.2f}  {rs[-1]['workers']}"
        )
    for case in ("loader", "bound"):
        if case in rounds:
            print(f"{case}: each rank's CPU budget: {' | '.join(rounds[case][-1]['budgets'])}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "rounds": rounds, "ceiling": ceiling}, indent=1)
        )


if __name__ == "__main__":
    main()
