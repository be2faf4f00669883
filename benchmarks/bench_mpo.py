"""JPEGs that hold several pictures (MPF; Pillow opens them as ``MPO``) against the same
JPEG stream alone: what a phone's photo with an HDR gain map, or a camera's with a preview,
costs a decode.

The photos: ``make_jpeg``'s (the demo's source photos) at about ``--megapixels``, each saved
twice from the same pixels — a plain JPEG, and an MPO whose second picture is a quarter-size
copy (a gain map's size).  Each case is ``decode_into`` of ``RandomResizedCrop(224)`` over
every photo in one process pinned to one core, rounds interleaved, medians; each sample's
seed the same in both cases.  Printed: CPU ms per image and the ratio of the plain JPEG's
CPU to the MPO's (its rate), and whether the two give the same pixels.

Run with another tree's package (``PYTHONPATH=<tree>``) to compare two versions of the
decode on the same photos.

Run: ``python benchmarks/bench_mpo.py [--images 24] [--megapixels 12] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time

import numpy as np
from PIL import Image

import asyncloader as al
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader.testing._demo import make_jpeg, source_photos


def photos(images: int, megapixels: float) -> tuple[list[bytes], list[bytes]]:
    """The plain JPEGs and the MPOs of the same pixels (quality 90)."""
    sources = source_photos()
    side = (megapixels * 1e6 / 12) ** 0.5
    plain, mpo = [], []
    for i in range(images):
        data = make_jpeg(sources, i, size=(round(side * 4), round(side * 3)))
        with Image.open(io.BytesIO(data)) as img:
            rgb = img.convert("RGB")
        one, two = io.BytesIO(), io.BytesIO()
        rgb.save(one, "JPEG", quality=90)
        small = rgb.resize((rgb.width // 4, rgb.height // 4))
        rgb.save(two, "MPO", quality=90, save_all=True, append_images=[small])
        plain.append(one.getvalue())
        mpo.append(two.getvalue())
    return plain, mpo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=24)
    p.add_argument("--megapixels", type=float, default=12)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with contextlib.suppress(OSError):  # one core: the figures are per core
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    plain, mpo = photos(args.images, args.megapixels)
    assert Image.open(io.BytesIO(mpo[0])).format == "MPO"
    spec = DecodeSpec((3, 224, 224), al.RandomResizedCrop(224))

    def timed(datas: list[bytes]) -> tuple[float, list[np.ndarray]]:
        outs = [np.empty((3, 224, 224), np.uint8) for _ in datas]
        t0 = time.process_time()
        for i, (data, out) in enumerate(zip(datas, outs, strict=True)):
            decode_into(data, out, spec, i, "k")
        return 1e3 * (time.process_time() - t0) / len(datas), outs

    runs: dict[str, list[float]] = {"jpeg": [], "mpo": []}
    same = True
    for r in range(args.rounds):
        for case in ("jpeg", "mpo") if r % 2 == 0 else ("mpo", "jpeg"):
            ms, outs = timed(plain if case == "jpeg" else mpo)
            runs[case].append(ms)
            if case == "mpo":
                _, ref = timed(plain[:4]) if r == 0 else (0.0, [])
                same &= all(np.array_equal(a, b) for a, b in zip(outs, ref, strict=False))
    jpeg, many = statistics.median(runs["jpeg"]), statistics.median(runs["mpo"])
    mb = sum(map(len, mpo)) / len(mpo) / 1e6
    print(
        f"{args.images} photos of {args.megapixels:g} MP ({mb:.1f} MB as MPO), "
        f"RandomResizedCrop(224), one core, medians of {args.rounds} rounds"
    )
    print(f"plain JPEG  {jpeg:7.2f} CPU ms/img")
    print(f"MPO         {many:7.2f} CPU ms/img  {jpeg / many:5.2f} x the plain JPEG's rate")
    print(f"the same pixels (first rounds' 4 photos): {same}")


if __name__ == "__main__":
    main()
