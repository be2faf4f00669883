"""The uploader: batches delivered to the GPU (or CPU) converted and normalised.

In one run:

1. **End to end** against our light S3 server (no added latency), each case in a fresh
   process: the loader's plain uint8 CPU batches (``device=None``), normalised float32 on the
   CPU (``device="cpu"``) and, with a GPU, float16 on it (``device="cuda"``).
   * *Rate*: images/s and CPU seconds per image with no training step, peak RSS.
   * *Wait*: then each again with a simulated training step the loader can keep up with
     (``--keep-up`` × the time the uint8 loader takes per batch; ``time.sleep`` on the
     CPU, a GPU kernel of that length on CUDA, after which the host reads the result as a
     loop reading its loss does): the time the training loop waited in ``next()`` per
     step and, on CUDA, the training stream's idle gap between steps (CUDA events).
2. **Host-to-device bandwidth** (CUDA only): the uploader alone, fed batch slots from a
   ring in host memory, against a plain pinned ``tensor.to(device, non_blocking=True)`` copy
   of the same bytes in the same run; page-locked ring (``pin="register"``) and pinned
   staging (``pin="staging"``).

Run: ``python benchmarks/bench_upload.py [--images 1500] [--keep-up 1.5]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl


def _gpu_cycles_per_ms() -> float:
    """Clock cycles ``torch.cuda._sleep`` spins per millisecond on this GPU."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10_000_000)  # warm-up
    a.record()
    torch.cuda._sleep(100_000_000)
    b.record()
    b.synchronize()
    return 100_000_000 / a.elapsed_time(b)


def case_loader(
    endpoint: str, device: str, batch: int, workers: int, step_ms: float
) -> dict[str, float]:
    import numpy as np
    import torch

    import asyncloader as al

    kw: dict[str, Any] = {}
    if device != "none":
        kw = {"device": device, "dtype": "float16" if device == "cuda" else "float32"}
    cuda = device == "cuda"
    cycles = int(step_ms * _gpu_cycles_per_ms()) if cuda and step_ms else 0
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        **kw,
        decode=al.DecodeConfig(workers=workers),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        next(iter(loader))  # start-up out of the figures
        loader.set_epoch(1)
        n = steps = 0
        waits: list[float] = []
        marks: list[tuple[Any, Any]] = []
        if loader._uploader is not None:
            loader._uploader.wait_seconds = 0.0
        t0, c0 = time.perf_counter(), bl._cpu()
        it = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                images, _ = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - w0)
            n += len(images)
            steps += 1
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
                start.record()
                if cycles:
                    torch.cuda._sleep(cycles)
                images.float().mean().item()  # the step reads the batch; the host waits
                end.record()
                marks.append((start, end))
            elif step_ms:
                time.sleep(step_ms / 1e3)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        res = {
            "images": n,
            "wall": wall,
            "cpu": bl._cpu() - c0,
            # The typical step's wait (the median), and the mean with the epoch's start.
            "wait_per_step_ms": float(np.median(waits)) * 1e3 if waits else 0.0,
            "mean_wait_ms": float(np.mean(waits)) * 1e3 if waits else 0.0,
            "steps": steps,
        }
        uploader = loader._uploader
        if uploader is not None:  # of the wait: time the device queue was empty
            res["queue_wait_ms"] = uploader.wait_seconds / max(steps, 1) * 1e3
        if marks:
            gaps = [a[1].elapsed_time(b[0]) for a, b in itertools.pairwise(marks)]
            res["stream_gap_ms"] = float(np.median(gaps)) if gaps else 0.0
            res["step_ms"] = float(np.median([a.elapsed_time(b) for a, b in marks]))
        return res


def case_h2d(batch: int, batches: int) -> dict[str, float]:
    import faulthandler

    import numpy as np
    import torch

    from asyncloader._device._device_spec import DeviceSpec

    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where, in the step's log
    from asyncloader._device._upload import Uploader

    dev = torch.device("cuda")
    slots = 4
    ring = np.random.default_rng(0).integers(0, 255, (slots, batch, 3, 224, 224), np.uint8)
    labels = torch.zeros(batch, dtype=torch.int64)
    nbytes = ring[0].nbytes * batches
    out: dict[str, float] = {}

    pinned = torch.from_numpy(ring[0]).pin_memory()
    for _ in range(3):
        pinned.to(dev, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        pinned.to(dev, non_blocking=True)
    torch.cuda.synchronize()
    out["plain pinned .to(non_blocking)"] = nbytes / (time.perf_counter() - t0) / 1e9

    for pin in ("register", "staging"):
        for dtype in ("uint8", "float16"):
            spec = DeviceSpec.make(dev, dtype)
            up = Uploader(spec, pin=pin)
            up.prepare(ring)

            def source() -> Any:
                for i in range(batches):
                    yield torch.from_numpy(ring[i % slots]), labels, None

            try:
                for _ in up.run(iter([(torch.from_numpy(ring[0]), labels, None)])):
                    pass  # warm-up: stream, events, allocator
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in up.run(source()):
                    pass
                torch.cuda.synchronize()
                out[f"uploader pin={pin} -> {dtype}"] = nbytes / (time.perf_counter() - t0) / 1e9
            finally:
                up.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument(
        "--keep-up",
        type=float,
        default=1.5,
        help="the simulated step, as a multiple of the uint8 loader's time per batch "
        "(0: no waits measured, the rates alone)",
    )
    p.add_argument("--step-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--h2d-batches", type=int, default=200)
    p.add_argument("--data-dir", default=str(bl.ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        kind, *rest = args.case
        if kind == "h2d":
            res = case_h2d(args.batch_size, args.h2d_batches)
        else:
            res = case_loader(rest[0], rest[1], args.batch_size, args.workers, args.step_ms)
        res["rss_mb"] = bl._peak_rss_mb()
        print(json.dumps(res))
        return

    import torch

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0)
    cuda = torch.cuda.is_available()
    devices = ["none", "cpu"] + (["cuda"] if cuda else [])
    common = ["--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    rates: dict[str, dict[str, float]] = {}
    waits: dict[str, dict[str, float]] = {}
    with S3TestServer(load=folder, bucket="b", prefix="train/") as srv:
        for device in devices:
            rates[device] = bl.run_case(["loader", srv.endpoint, device, *common], __file__)
        per_batch_ms = rates["none"]["wall"] / rates["none"]["steps"] * 1e3
        step_ms = args.keep_up * per_batch_ms
        for device in devices if args.keep_up > 0 else ():
            case = ["loader", srv.endpoint, device, *common, "--step-ms", str(step_ms)]
            waits[device] = bl.run_case(case, __file__)
    base = rates["none"]["images"] / rates["none"]["wall"]
    print(f"\nend to end: {args.images} images, batch {args.batch_size}, {args.workers} workers")
    print(
        f"{'delivered':28s} {'img/s':>7s} {'x uint8 CPU':>11s} {'CPU ms/img':>10s} "
        f"{'peak MB':>8s} {'wait/step ms':>12s} {'(mean)':>7s} {'GPU idle/step ms':>16s}"
    )
    names = {
        "none": "uint8 CPU (device=None)",
        "cpu": "float32 CPU (device='cpu')",
        "cuda": "float16 GPU (device='cuda')",
    }
    for device, r in rates.items():
        ips = r["images"] / r["wall"]
        cpu_ms = r["cpu"] / r["images"] * 1e3
        nan = float("nan")
        w = waits.get(device, {"rss_mb": 0.0, "wait_per_step_ms": nan, "mean_wait_ms": nan})
        gap = f"{w['stream_gap_ms']:16.2f}" if "stream_gap_ms" in w else f"{'':16s}"
        print(
            f"{names[device]:28s} {ips:7.0f} {ips / base:11.2f} {cpu_ms:10.2f} "
            f"{max(r['rss_mb'], w['rss_mb']):8.0f} {w['wait_per_step_ms']:12.2f} "
            f"{w['mean_wait_ms']:7.1f} {gap}"
        )
    print(
        f"(img/s and CPU: no training step; waits, median per step (mean), and the GPU's "
        f"idle gap between steps (median): with a {step_ms:.0f} ms step, "
        f"{args.keep_up:g} x the uint8 loader's {per_batch_ms:.0f} ms per batch"
        + (
            f"; the GPU step measured {waits['cuda']['step_ms']:.0f} ms)"
            if "cuda" in waits
            else ")"
        )
    )
    if not cuda:
        print("\nno CUDA device here: the GPU rows and the host-to-device figures are skipped")
        return
    h2d = bl.run_case(["h2d", *common, "--h2d-batches", str(args.h2d_batches)], __file__)
    plain = h2d.pop("plain pinned .to(non_blocking)")
    h2d.pop("rss_mb")
    gpu = torch.cuda.get_device_name()
    print(f"\nhost to device, {args.batch_size}x3x224x224 uint8 batches ({gpu})")
    print(f"{'path':36s} {'GB/s':>7s} {'x plain pinned':>15s}")
    print(f"{'plain pinned .to(non_blocking)':36s} {plain:7.1f} {1.0:15.2f}")
    for name, gbs in h2d.items():
        print(f"{name:36s} {gbs:7.1f} {gbs / plain:15.2f}")


if __name__ == "__main__":
    main()
