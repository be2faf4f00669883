"""GPU decode with engine processes, the CPU's part of it: what an engine spends per image
to ship a JPEG instead of decoding it, and what the training process spends per image on
a shipped batch besides the GPU's work.

Needs no GPU.  From the demo's photos in memory (the cache's and the network's part left
out), batches of ``--batch-size``, RandomResizedCrop(224), in this process:

* ``decode`` — the engine's decode threads (``ThreadDecodePool``) decoding each batch into
  a shared ring: the CPU backend's work per image, the baseline;
* ``ship``   — the same threads with a shipper (``_decode/_ship.py``): each JPEG's header
  read, its crop planned, its bytes copied into the slot's arena;
* ``unpack`` — the training process's host work on a shipped batch before the GPU is
  called (``_gpu_batch``: the records read, the bytes staged in one buffer for nvJPEG);
* ``resize`` — the training process's host work to crop, resize and flip a decoded batch
  (``GpuBatcher._resize``), launch-bound: 32 × 24 images to 8 × 8 on the CPU, so that the
  arithmetic is negligible and what is left is what each torch call costs the caller, as a
  CUDA kernel launch does.  Printed with the torch operations dispatched per image (views
  not counted), and against ``resize-1``: the same with one image a group (each image's
  own gather, weights and matrix products).

Printed: CPU ms per image of each (``time.process_time``, every thread of this process),
the median of ``--rounds`` interleaved rounds, and ship / decode.  The GPU's own part and
the training process's CPU per image end to end are ``bench_gpu_decode.py``'s (on a GPU).

Run: ``python benchmarks/bench_ship.py [--images 512] [--rounds 5] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl

from asyncloader._base._types import CacheEvent, DecodeJob
from asyncloader._decode._gpu_batch import GpuBatcher, GpuWork, _works
from asyncloader._decode._image import DecodeSpec
from asyncloader._decode._ship import Shipper
from asyncloader._decode._threads import ThreadDecodePool
from asyncloader._decode._transforms import RandomResizedCrop
from asyncloader._device._ring import BatchRing
from asyncloader.testing._demo import make_jpeg_folder

SPEC = DecodeSpec((3, 224, 224), RandomResizedCrop(224))


def _pool_seconds(
    ring: BatchRing, data: list[bytes], batch: int, workers: int, ship: bool
) -> float:
    """CPU seconds of the engine's threads over every batch of ``data``."""
    shipper = None
    if ship:
        assert ring.records is not None
        assert ring.arena is not None
        shipper = Shipper(SPEC, ring.images, ring.records, ring.arena)
    pool = ThreadDecodePool(workers, SPEC, ring.images, shipper)

    async def go() -> float:
        t0 = time.process_time()
        try:
            for b, start in enumerate(range(0, len(data), batch)):
                part = data[start : start + batch]
                jobs = [
                    DecodeJob(d, b % ring.slots, i, b * batch + i, f"k{i}")
                    for i, d in enumerate(part)
                ]
                for outcome in await pool.decode_many(jobs, b):
                    if isinstance(outcome, BaseException):
                        raise outcome
            return time.process_time() - t0
        finally:
            await pool.drain()
            await pool.aclose()

    return asyncio.run(go())


def _unpack_seconds(ring: BatchRing, n: int, batches: int) -> float:
    """CPU seconds of the training process's host work on ``batches`` shipped batches of
    ``n`` (the records read, the bytes staged): ``GpuBatcher``'s own staging."""
    batcher = GpuBatcher(SPEC, torch.device("cpu"), decode_batch=lambda x: [])
    t0 = time.process_time()
    for b in range(batches):
        shipped, labels = ring.lease(b % ring.slots, n)
        assert not isinstance(shipped, np.ndarray)
        works = _works(shipped)
        batcher.stage([w.data for w in works])
        del shipped, labels, works
    return time.process_time() - t0


class _Ops(TorchDispatchMode):
    """Counts the torch operations dispatched (views, which launch nothing, left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _resize_cost(batch: int, repeats: int, one_a_group: bool) -> tuple[float, float]:
    """CPU seconds per image of ``GpuBatcher._resize`` on batches of ``batch`` tiny images
    (launch-bound, see the module's docstring), and torch operations per image; every
    image its own group where ``one_a_group``."""
    import asyncloader._decode._gpu_batch as gb

    spec = DecodeSpec((3, 8, 8), RandomResizedCrop(8))
    batcher = GpuBatcher(spec, torch.device("cpu"), decode_batch=lambda x: [])
    rng = random.Random(0)
    works = []
    for i in range(batch):
        plan = spec.transform.plan(32, 24, rng)  # type: ignore[union-attr]
        job = DecodeJob(None, 0, i, i, f"k{i}")
        works.append(GpuWork(None, job, b"", CacheEvent.NONE, 0.0, plan.box, (32, 24), plan.flip))
    gen = torch.Generator().manual_seed(0)
    decoded = [torch.randint(0, 256, (3, 24, 32), dtype=torch.uint8, generator=gen)] * batch
    images = torch.empty((1, batch, 3, 8, 8), dtype=torch.uint8)
    crop_max = gb._CROP_MAX
    gb._CROP_MAX = 0 if one_a_group else crop_max
    try:
        with _Ops() as ops:
            batcher._resize(works, decoded, images)
        t0 = time.process_time()
        for _ in range(repeats):
            batcher._resize(works, decoded, images)
        seconds = time.process_time() - t0
    finally:
        gb._CROP_MAX = crop_max
    return seconds / (repeats * batch), ops.count / batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--data-dir", default=str(bl.ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--json", default="")
    args = p.parse_args()
    folder = make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0)
    data = [f.read_bytes() for f in bl._files(folder)][: args.images]
    batch = args.batch_size
    batches = -(-len(data) // batch)
    ring = BatchRing(4, batch, SPEC.sample_shape, shared=True, arena=batch * (512 << 10))
    runs: dict[str, list[float]] = {
        k: [] for k in ("decode", "ship", "unpack", "resize", "resize-1")
    }
    ops: dict[str, float] = {}
    try:
        for _ in range(args.rounds):
            runs["decode"].append(_pool_seconds(ring, data, batch, args.workers, ship=False))
            runs["ship"].append(_pool_seconds(ring, data, batch, args.workers, ship=True))
            # The last batches shipped are in the ring's slots: unpacked as many times.
            runs["unpack"].append(_unpack_seconds(ring, batch, batches))
            for name, one in (("resize", False), ("resize-1", True)):
                seconds, ops[name] = _resize_cost(batch, max(1, 2048 // batch), one)
                runs[name].append(seconds * len(data))
    finally:
        ring.close()
    ms = {k: 1e3 * statistics.median(v) / len(data) for k, v in runs.items()}
    size = sum(map(len, data)) / len(data) / 1e3
    print(
        f"{len(data)} photos of ~{size:.0f} KB, RandomResizedCrop(224), batches of {batch}, "
        f"{args.workers} engine threads; CPU ms per image, medians of {args.rounds} rounds"
    )
    print(f"engine, decode (the CPU backend)  {ms['decode']:.4f}")
    ratio = ms["ship"] / ms["decode"]
    print(f"engine, ship (GPU decode)         {ms['ship']:.4f}  ({ratio:.3f} x decode)")
    print(f"training process, unpack (host)   {ms['unpack']:.4f}")
    ratio = ms["resize"] / ms["resize-1"]
    print(
        f"training process, resize (host)   {ms['resize']:.4f}  ({ratio:.3f} x one image a "
        f"group: {ms['resize-1']:.4f}); torch operations per image {ops['resize']:.2f} "
        f"against {ops['resize-1']:.2f}"
    )
    if args.json:
        out: dict[str, Any] = {
            "args": vars(args),
            "rounds": runs,
            "ms_per_image": ms,
            "ops_per_image": ops,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
