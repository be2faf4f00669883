"""``ImageDataset`` inside a ``DataLoader(num_workers=k)`` against the plain loader, at the
same total process count.

In one run, against our light S3 server at ``--latency`` (20 ms), each case in a fresh
process, two epochs (the second timed):

* the plain loader, ``k`` decode threads in one engine process (``1 + 1`` processes);
* the plain loader, ``k`` engine processes of one decode thread each (``1 + k`` processes);
* ``DataLoader(ImageDataset, batch_size=None, num_workers=k)``, one decode thread per worker
  (``1 + k`` processes).

Images/s, ratio to the plain loader with ``k`` engines (the same process count), CPU seconds
per image over all processes, peak RSS of the main process.
Run: ``python benchmarks/bench_torch.py [--workers 2] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl


def case(kind: str, endpoint: str, batch: int, workers: int) -> dict[str, float]:
    import asyncloader as al

    opts = {"endpoint_url": endpoint}
    if kind == "dataloader":
        from torch.utils.data import DataLoader

        from asyncloader.torch import ImageDataset

        ds = ImageDataset(
            "s3://b/train/",
            batch_size=batch,
            decode=al.DecodeConfig(workers=1),
            store=al.StoreConfig(options=opts),
        )
        dl = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True)
        epochs = iter(range(2))

        def run() -> int:
            ds.set_epoch(next(epochs))
            return sum(len(x) for x, _ in dl)
    else:
        loader = al.ImageLoader(
            "s3://b/train/",
            batch_size=batch,
            decode=al.DecodeConfig(workers=workers),
            engine=al.EngineConfig(processes=workers if kind == "engines" else 1),
            store=al.StoreConfig(options=opts),
        )

        def run() -> int:
            return sum(len(x) for x, _ in loader)

    run()  # start-up and a first epoch out of the figures
    t0, c0 = time.perf_counter(), bl._cpu()  # live workers' CPU included (from /proc)
    n = run()
    wall = time.perf_counter() - t0
    return {"images": n, "wall": wall, "cpu": bl._cpu() - c0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data-dir", default=str(bl.ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        res = case(args.case[0], args.case[1], args.batch_size, args.workers)
        res["rss_mb"] = bl._peak_rss_mb()
        print(json.dumps(res))
        return
    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0)
    kinds = {
        "thread": f"plain loader, {args.workers} decode threads",
        "engines": f"plain loader, {args.workers} engines x 1 thread",
        "dataloader": f"DataLoader, {args.workers} workers x 1 thread",
    }
    common = ["--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    with S3TestServer(load=folder, bucket="b", prefix="train/", latency=args.latency) as srv:
        for _ in range(args.repeat):
            for kind in kinds:
                runs[kind].append(bl.run_case([kind, srv.endpoint, *common], __file__))
    ips = {k: [r["images"] / r["wall"] for r in rs] for k, rs in runs.items()}
    ratio = [d / p for d, p in zip(ips["dataloader"], ips["engines"], strict=True)]
    print(
        f"\n{args.images} images, batch {args.batch_size}, {args.latency * 1e3:.0f} ms latency, "
        f"{os.cpu_count()} cores, median of {args.repeat}"
    )
    print(f"{'case':40s} {'img/s':>7s} {'CPU ms/img':>10s} {'peak MB':>8s}")
    for k, rs in runs.items():
        cpu = statistics.median(r["cpu"] / r["images"] * 1e3 for r in rs)
        rss = statistics.median(r["rss_mb"] for r in rs)
        print(f"{kinds[k]:40s} {statistics.median(ips[k]):7.0f} {cpu:10.2f} {rss:8.0f}")
    print(
        "DataLoader / plain loader at the same process count: "
        + ", ".join(f"{x:.2f}" for x in ratio)
        + f" (median {statistics.median(ratio):.2f})"
    )


if __name__ == "__main__":
    main()
