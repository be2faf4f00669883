"""What ``DecodeConfig(exif_orientation=True)`` costs a decode.

The photos: ``bench_buckets.py``'s (the demo's JPEGs cut to 1:1, 3:2 and 2:3), and the same
bytes with an EXIF orientation tag spliced in (an APP1 segment of 34 bytes: the stored
pixels are the same) — 6, a phone's portrait photo stored landscape (width and height swap),
and 3 (turned half round: they do not).  Each case is ``decode_into`` over every photo, as a
decode worker runs it (the region decode, the turn where there is one, the resize), in this
one process pinned to one core, rounds interleaved, medians; each sample's plan made before
the timed loops:

* ``off``: the option off, untagged photos (the baseline: today's decode);
* ``on, untagged``: the option on, the same photos (what reading "no orientation" costs);
* ``off, tagged 6``: the option off, tagged photos (decoded as stored);
* ``on, tagged 6`` and ``on, tagged 3``: the option on, tagged photos (turned upright).

For ``RandomResizedCrop(224)`` and for aspect-ratio buckets
(``make_buckets(224 * 224, ratios=(0.5, 2.0), step=32)``, each photo in the bucket of its
shape — the upright shape where it is turned).  Printed: CPU ms per image, the ratio of the
baseline's CPU to each case's (its rate), and the process's peak RSS.

Run: ``python benchmarks/bench_orientation.py [--images 1200] [--rounds 5] [--json F]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import asyncloader as al
from asyncloader._base._orientation import exif_segment, orientation, upright_size
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader._decode._transforms import bucket_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_buckets import shaped_folder  # the same photos

CASES = ("off", "on, untagged", "off, tagged 6", "on, tagged 6", "on, tagged 3")
BUCKETS = al.make_buckets(224 * 224, ratios=(0.5, 2.0), step=32)


def _tagged(data: bytes, o: int) -> bytes:
    return data[:2] + exif_segment(o) + data[2:]


def run(folder: Path, rounds: int) -> dict[str, dict[str, float]]:
    with contextlib.suppress(OSError):  # one core: the figures are per core
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    plain = [f.read_bytes() for f in sorted(folder.glob("*.jpg"))]
    photos = {1: plain, 6: [_tagged(d, 6) for d in plain], 3: [_tagged(d, 3) for d in plain]}
    cases: dict[str, tuple[bool, int]] = {
        "off": (False, 1),
        "on, untagged": (True, 1),
        "off, tagged 6": (False, 6),
        "on, tagged 6": (True, 6),
        "on, tagged 3": (True, 3),
    }

    def plans(kind: str, upright: bool, o: int) -> list[tuple[DecodeSpec, Any]]:
        out = []
        for i, data in enumerate(photos[o]):
            with Image.open(io.BytesIO(data)) as img:
                w, h = upright_size(*img.size, orientation(img) if upright else 1)
            if kind == "buckets":
                bh, bw = BUCKETS.sizes[int(BUCKETS.nearest([h], [w])[0])]
                spec = DecodeSpec((3, bh, bw), buckets=BUCKETS, exif_orientation=upright)
                bucket_plan(w, h, (bh, bw), random.Random(i))  # as the loader plans it
                out.append((spec, (bh, bw, h, w)))
            else:
                t = al.RandomResizedCrop(224)
                out.append((DecodeSpec((3, 224, 224), t, exif_orientation=upright), None))
        return out

    made = {
        (kind, case): plans(kind, *how)
        for kind in ("square", "buckets")
        for case, how in cases.items()
    }

    def timed(kind: str, case: str) -> float:
        datas = photos[cases[case][1]]
        todo = made[(kind, case)]
        outs = [np.empty(spec.sample_shape, np.uint8) for spec, _ in todo]
        t0 = time.process_time()
        for i, (data, (spec, mark), out) in enumerate(zip(datas, todo, outs, strict=True)):
            decode_into(data, out, spec, i, "k", mark)
        return 1e3 * (time.process_time() - t0) / len(datas)

    runs: dict[str, list[float]] = {}
    order = [(kind, case) for kind in ("square", "buckets") for case in CASES]
    for r in range(rounds):
        for kind, case in order if r % 2 == 0 else order[::-1]:
            runs.setdefault(f"{kind}: {case}", []).append(timed(kind, case))
    return {k: {"cpu_ms_per_image": statistics.median(v), "rounds": v} for k, v in runs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data-dir", default="cache/bench-buckets")
    p.add_argument("--json", default="")
    args = p.parse_args()
    folder = shaped_folder(Path(args.data_dir), args.images)
    got = run(folder, args.rounds)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.images} photos in 3 aspect ratios, decoded in one process on one core; "
        f"medians of {args.rounds} interleaved rounds; peak RSS {peak:.0f} MB"
    )
    for kind in ("square", "buckets"):
        base = got[f"{kind}: off"]["cpu_ms_per_image"]
        for case in CASES:
            ms = got[f"{kind}: {case}"]["cpu_ms_per_image"]
            print(f"{kind:8s} {case:15s} {ms:6.3f} CPU ms/img  {base / ms:5.2f} x off's rate")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "cases": got, "peak_rss_mb": peak}, indent=1)
        )


if __name__ == "__main__":
    main()
