"""The SSD cache: cold epoch vs warm epoch vs the decode ceiling, and ``warm`` throughput.

In one run, against our light S3 server at ``--latency`` (20 ms):

1. the decode ceiling (as in bench_loader.py: the better of a thread and a process pool);
2. asyncloader, two epochs in each of two runs (subprocesses) on one cache folder: the
   first run's first epoch is cold (network + write-back, start-up included), everything
   after it is served from disk.  torch is imported before the clock starts, as in a
   training script (the loader imports it at the first batch otherwise: 2.4 s of CPU here);
3. ``asyncloader warm`` into a fresh cache at several request counts in flight: objects/s,
   MB/s, and CPU per object split into the event loop (GETs) and the writer thread (packs +
   index);
4. with ``--small-cache``: shuffled epochs through a cache a third of the data's size: hits
   per epoch against the cache's share of the data, objects stored per epoch, the folder's
   size against its limit.

Run: ``python benchmarks/bench_cache.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl


def case_loader(endpoint: str, cache_dir: str, batch: int, workers: int) -> dict[str, float]:
    import torch  # noqa: F401  (a training script has it: not part of the first epoch)

    import asyncloader as al

    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        cache_dir=cache_dir or None,
        decode=al.DecodeConfig(workers=workers),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        out: dict[str, float] = {}
        for epoch in ("first", "second"):
            before = loader.stats()
            t0, c0 = time.perf_counter(), bl._cpu()
            n = sum(len(x) for x, _ in loader)
            out[f"{epoch}_images"] = n
            out[f"{epoch}_wall"] = time.perf_counter() - t0
            out[f"{epoch}_cpu"] = bl._cpu() - c0
            after = loader.stats()
            out[f"{epoch}_requests"] = after.requests - before.requests
            # Samples decoded meanwhile: the epoch's, and the next epoch's first ones
            # (the loader starts them as slots free up; cache hits decode at once).
            out[f"{epoch}_decoded"] = after.decoded - before.decoded
    return out


def case_small(endpoint: str, cache_dir: str, batch: int, workers: int, epochs: int) -> dict:
    """Shuffled epochs through a cache a third of the data's size (one loader)."""
    import asyncloader as al

    total = al.describe("s3://b/train/", store_options={"endpoint_url": endpoint}).sample_bytes
    limit = total // 3
    out: dict[str, Any] = {"limit": limit, "total": total, "epochs": []}
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        cache_dir=cache_dir,
        cache=al.CacheConfig(size=limit),
        decode=al.DecodeConfig(workers=workers),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        for epoch in range(epochs):
            before = loader.stats()
            loader.set_epoch(epoch)
            n = sum(len(x) for x, _ in loader)
            after = loader.stats()
            out["epochs"].append(
                {
                    "samples": n,
                    "hits": after.cache_hits - before.cache_hits,
                    "stored": after.cache_stored - before.cache_stored,
                }
            )
        out["share"] = loader.stats().cache_share
    out["volume"] = al.ObjectCache(cache_dir, size_limit=limit).stats().volume
    return out


def case_warm(endpoint: str, cache_dir: str, concurrency: int) -> dict[str, float]:
    import asyncloader as al

    c0 = time.process_time()
    r = al.warm(
        "s3://b/train/",
        cache_dir,
        max_inflight=concurrency,
        store_options={"endpoint_url": endpoint},
    )
    cpu = time.process_time() - c0
    return {
        "objects": r.warmed,
        "wall": r.seconds,
        "bytes": r.bytes_fetched,
        "cpu": cpu,
        "write_cpu": r.write_cpu_seconds,
        "failed": len(r.failed),
    }


def _sub(*args: str) -> dict[str, float]:
    return bl.run_case(list(args), script=__file__)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--inflight", default="16,64,256")
    p.add_argument("--repeat", type=int, default=3, help="rounds of all cases")
    p.add_argument("--data-dir", default=str(bl.ROOT / "cache" / "bench-jpegs"))
    p.add_argument(
        "--small-cache",
        type=int,
        default=0,
        metavar="EPOCHS",
        help="also run EPOCHS shuffled epochs through a cache a third of the data's size",
    )
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        kind, endpoint, cache_dir, *rest = args.case
        if kind == "loader":
            res = case_loader(endpoint, cache_dir, args.batch_size, args.workers, *rest)
        elif kind == "small":
            res = case_small(endpoint, cache_dir, args.batch_size, args.workers, int(rest[0]))
        else:
            res = case_warm(endpoint, cache_dir, int(rest[0]))
        print(json.dumps(res))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0)
    common = ["--data-dir", str(folder), "--workers", str(args.workers)]
    common += ["--batch-size", str(args.batch_size)]
    rounds: list[Any] = []
    for _ in range(args.repeat):  # every case once per round; ratios to the round's ceiling
        ceilings = [bl.run_case(["ceiling", kind, *common]) for kind in ("thread", "process")]
        tmp = Path(tempfile.mkdtemp(prefix="asyncloader-bench-"))
        try:
            with S3TestServer(
                latency=args.latency, load=folder, bucket="b", prefix="train/"
            ) as srv:
                ep = srv.endpoint
                nocache = _sub("loader", ep, "", *common)
                run1 = _sub("loader", ep, str(tmp / "epochs"), *common)
                run2 = _sub("loader", ep, str(tmp / "epochs"), *common)
                small = (
                    _sub("small", ep, str(tmp / "small"), str(args.small_cache), *common)
                    if args.small_cache
                    else None
                )
                warms = {
                    n: _sub("warm", ep, str(tmp / f"warm{n}"), str(n), *common)
                    for n in (int(x) for x in args.inflight.split(",") if x)
                }
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rounds.append(
            (
                max(ceilings, key=lambda r: r["images"] / r["wall"]),
                run1,
                run2,
                warms,
                nocache,
                small,
            )
        )
    lat = args.latency * 1e3
    print(
        f"\n{args.images} JPEGs, {args.workers} workers, {os.cpu_count()} cores, {lat:.0f} ms, "
        f"{args.repeat} round(s): medians, ratios to each round's ceiling"
    )
    print(
        f"{'epoch':28s} {'img/s':>7s} {'x ceil':>7s} {'CPU ms/img':>10s} {'x ceil':>7s}  "
        "GETs  x ceil per round"
    )

    def part(r: dict[str, float], epoch: str) -> dict[str, float]:
        return {k: r[f"{epoch}_{k}"] for k in ("images", "wall", "cpu", "requests")}

    names = [
        "decode ceiling (RAM)",
        "no cache: 1st epoch",
        "no cache: 2nd epoch",
        "cold: 1st epoch, 1st run",
        "warm: 2nd epoch (disk)",
        "later run: 1st epoch (disk)",
        "later run: 2nd epoch (disk)",
    ]
    med = statistics.median
    for i, name in enumerate(names):
        ips, xc, cpu, xcpu, gets = [], [], [], [], []
        for ceiling, run1, run2, _, nocache, _ in rounds:
            r = [ceiling, part(nocache, "first"), part(nocache, "second")]
            r += [part(run1, "first"), part(run1, "second")]
            r += [part(run2, "first"), part(run2, "second")]
            ips.append(r[i]["images"] / r[i]["wall"])
            cpu.append(r[i]["cpu"] / r[i]["images"])
            xc.append(ips[-1] / (ceiling["images"] / ceiling["wall"]))
            xcpu.append(cpu[-1] / (ceiling["cpu"] / ceiling["images"]))
            gets.append(int(r[i].get("requests", 0)))
        print(
            f"{name:28s} {med(ips):7.0f} {med(xc):7.2f} {med(cpu) * 1e3:10.2f} "
            f"{med(xcpu):7.2f}  {max(gets):4d}  {' '.join(f'{x:.2f}' for x in xc)}"
        )

    # What filling the cache costs: the cold epoch against the same epoch without a cache.
    def cold_over_nocache(of: str, per: str) -> list[float]:
        """Per round: the cold epoch's ``of`` per ``per`` over the no-cache epoch's."""
        return [
            (run1[f"first_{of}"] / run1[f"first_{per}"]) / (nc[f"first_{of}"] / nc[f"first_{per}"])
            for _, run1, _, _, nc, _ in rounds
        ]

    speed = cold_over_nocache("images", "wall")
    cpu_x = cold_over_nocache("cpu", "images")
    print(
        f"\ncold epoch filling the cache / the same epoch without a cache: img/s "
        f"{med(speed):.2f} x ({' '.join(f'{x:.2f}' for x in speed)}), CPU per image "
        f"{med(cpu_x):.2f} x ({' '.join(f'{x:.2f}' for x in cpu_x)})"
    )
    # The same, per sample decoded while the epoch ran: both loaders start the next epoch
    # as slots free up, but its cache hits are decoded at once, its fetches only later.
    decoded = [(run1["first_decoded"], nc["first_decoded"]) for _, run1, _, _, nc, _ in rounds]
    per_decoded = cold_over_nocache("decoded", "wall")
    print(
        f"  per sample decoded in the epoch's time (cold {med(a for a, _ in decoded):.0f}, "
        f"no cache {med(b for _, b in decoded):.0f}, of {rounds[0][1]['first_images']:.0f} in "
        f"the epoch): {med(per_decoded):.2f} x "
        f"({' '.join(f'{x:.2f}' for x in per_decoded)})"
    )
    if args.small_cache:
        print("\nshuffled epochs through a cache a third of the data's size")
        print(f"{'epoch':>5s} {'hits':>6s} {'hits / (share x samples)':>25s} {'stored':>7s}")
        smalls = [r[5] for r in rounds]
        for e in range(args.small_cache):
            hits = [sm["epochs"][e]["hits"] for sm in smalls]
            rel = [
                sm["epochs"][e]["hits"] / (sm["share"] * sm["epochs"][e]["samples"])
                for sm in smalls
            ]
            stored = [sm["epochs"][e]["stored"] for sm in smalls]
            print(
                f"{e:5d} {med(hits):6.0f} {med(rel):25.2f} {med(stored):7.0f}  "
                f"({' '.join(f'{x:.2f}' for x in rel)})"
            )
        sm = smalls[0]
        print(
            f"cache share of the data {med(x['share'] for x in smalls):.2f}; folder "
            f"{sm['volume'] / 1e6:.0f} MB of a {sm['limit'] / 1e6:.0f} MB limit "
            f"(data {sm['total'] / 1e6:.0f} MB)"
        )
    if not rounds[0][3]:
        return
    print(f"\nasyncloader warm @{lat:.0f} ms (fresh cache each), medians")
    print(
        f"{'in flight':>9s} {'objects/s':>10s} {'MB/s':>7s} {'CPU ms/obj':>11s} "
        f"{'loop+GET':>9s} {'write':>7s}  objects/s per round"
    )
    for n in rounds[0][3]:
        rs = [r[3][n] for r in rounds]
        per = [r["objects"] / r["wall"] for r in rs]
        o = [max(r["objects"], 1) for r in rs]
        cpu = med(r["cpu"] / k for r, k in zip(rs, o, strict=True))
        write = med(r["write_cpu"] / k for r, k in zip(rs, o, strict=True))
        loop = med((r["cpu"] - r["write_cpu"]) / k for r, k in zip(rs, o, strict=True))
        print(
            f"{n:9d} {med(per):10.0f} {med(r['bytes'] / r['wall'] for r in rs) / 1e6:7.1f} "
            f"{cpu * 1e3:11.2f} {loop * 1e3:9.2f} {write * 1e3:7.2f}  "
            f"{' '.join(f'{x:.0f}' for x in per)}"
        )


if __name__ == "__main__":
    main()
