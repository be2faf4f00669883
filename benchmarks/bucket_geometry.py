"""A bucket's pixels against two ways of writing them with Pillow (a check, not a timing).

For random image sizes, buckets and seeds (JPEGs made here, decoded by ``decode_into`` as a
decode worker does), each bucketed sample is compared with:

* ``box``    — docs/data.md's formula: ``img.resize((bw, bh), BILINEAR, box=...)`` with
  the box in source pixels from ``original_size`` and ``crop_top_left`` (the decode scaled
  as Pillow's ``draft`` scales it where the JPEG is twice the resized size or more): the
  loader's definition, expected equal everywhere;
* ``resize-then-crop`` — ``img.resize((rw, rh), BILINEAR).crop(...)``: the whole image
  resized, then cropped at ``crop_top_left`` (the same decode). Both are written from
  :func:`asyncloader.testing.bucket_reference`. Pillow computes the second in other steps
  (its box is single precision), so a level's difference here and there is expected;
  printed: the share of samples with any difference, the share of their pixels, and the
  largest difference.

Run: ``python benchmarks/bucket_geometry.py [--cases 2000] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import io
import random

import numpy as np
from PIL import Image

import asyncloader as al
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader._decode._transforms import bucket_plan
from asyncloader.testing import bucket_reference


def _one(rng: np.random.Generator, seed: int) -> tuple[bool, float, int]:
    """One random case: (box equal?, share of pixels resize-then-crop differs in, its
    largest difference)."""
    width, height = int(rng.integers(24, 700)), int(rng.integers(24, 700))
    bh, bw = int(rng.integers(8, 300)), int(rng.integers(8, 300))
    small = (rng.random((height // 4 + 1, width // 4 + 1, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR).save(buf, "JPEG")
    data = buf.getvalue()
    spec = DecodeSpec((3, bh, bw), buckets=al.Buckets(((bh, bw),)))
    out = np.zeros((3, bh, bw), np.uint8)
    decode_into(data, out, spec, seed, "case", mark=(bh, bw, height, width))
    got = out.transpose(1, 2, 0).astype(np.int16)
    _, (top, left) = bucket_plan(width, height, (bh, bw), random.Random(seed))
    img, box, (rw, rh) = bucket_reference(data, (bh, bw), (top, left))
    by_box = np.asarray(img.resize((bw, bh), Image.Resampling.BILINEAR, box=box))
    if img.size != (width, height):  # DCT-scaled: resize-then-crop has no one meaning there
        return bool(np.array_equal(got, by_box)), -1.0, 0
    whole = img.resize((rw, rh), Image.Resampling.BILINEAR)
    cropped = np.asarray(whole.crop((left, top, left + bw, top + bh))).astype(np.int16)
    diff = np.abs(cropped - got).max(axis=2)
    return bool(np.array_equal(got, by_box)), float((diff > 0).mean()), int(diff.max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    results = [_one(rng, args.seed * 1_000_003 + i) for i in range(args.cases)]
    box_equal = sum(r[0] for r in results)
    whole = [r for r in results if r[1] >= 0]
    differ = [r for r in whole if r[1] > 0]
    print(f"{args.cases} cases: the documented box formula equals the decode in {box_equal}")
    print(
        f"resize-then-crop (the {len(whole)} cases decoded at full scale): differs in "
        f"{len(differ)} ({len(differ) / max(len(whole), 1):.0%}); in those, "
        f"{np.median([r[1] for r in differ]) if differ else 0:.2%} of pixels (median), "
        f"largest difference {max((r[2] for r in differ), default=0)} level(s)"
    )


if __name__ == "__main__":
    main()
