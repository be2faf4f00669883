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
  called (``_gpu_batch``: the records read, the bytes staged in one buffer for nvJPEG).

Printed: CPU ms per image of each (``time.process_time``, every thread of this process),
the median of ``--rounds`` interleaved rounds, and ship / decode.  The GPU's own part and
the training process's CPU per image end to end are ``bench_gpu_decode.py``'s (on a GPU).

Run: ``python benchmarks/bench_ship.py [--images 512] [--rounds 5] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl

from asyncloader._base._types import DecodeJob
from asyncloader._decode._gpu_batch import GpuBatcher, _works
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
    runs: dict[str, list[float]] = {"decode": [], "ship": [], "unpack": []}
    try:
        for _ in range(args.rounds):
            runs["decode"].append(_pool_seconds(ring, data, batch, args.workers, ship=False))
            runs["ship"].append(_pool_seconds(ring, data, batch, args.workers, ship=True))
            # The last batches shipped are in the ring's slots: unpacked as many times.
            runs["unpack"].append(_unpack_seconds(ring, batch, batches))
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
    if args.json:
        out: dict[str, Any] = {"args": vars(args), "rounds": runs, "ms_per_image": ms}
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
