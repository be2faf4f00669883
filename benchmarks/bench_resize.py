"""The resize extension's kernels against each other and against Pillow, on the jobs a
decode worker runs.

Each job resizes a box of an 8-bit image (RGBX, as the region decoder gives it, or RGB, as
Pillow decodes other formats) to a sample with Pillow's BILINEAR weights, straight into its
planes (``_decode/_resize.c``'s ``resize_into``):

* ``bucket 3:2`` — a 427 × 284 photo, whole, into the 288 × 192 bucket (a bucketed run's
  usual job: every source row is read);
* ``square crop`` — a 284 × 284 box of it to 224 × 224 (a ``RandomResizedCrop``'s box, two
  thirds of the photo);
* ``square whole`` — a 427 × 427 photo to 224 × 224 (``Resize(224)``'s square case);
* ``bucket 3:2 RGB`` — the first job from 3-byte pixels (a PNG, a WebP);
* ``large to bucket`` — a 1000 × 700 image into 288 × 192 (a photo at 1/4 scale).

Paths: ``pillow`` (``Image.resize`` of the box, then the copy into the sample's planes: what
the extension replaces), and each kernel level this CPU runs (``simd=0`` scalar, ``1``
SSE4.1 — the default before the AVX2 kernels — or on AArch64 NEON, ``2`` AVX2).  Every
path's pixels are checked equal to Pillow's before timing.  Rounds interleave the paths
(the order flips each round); printed: CPU ms per call (medians of the rounds, each the
mean of ``--calls`` calls), the ratio to Pillow and to SSE4.1, and peak RSS.

``--against TREE``: another checkout's extension too (built there with ``python setup.py
build_ext --inplace``), each of its levels a path ``A <level>`` in the same rounds, and
the ratio of each level to A's.

Run: ``python benchmarks/bench_resize.py [--rounds 5] [--calls 300] [--json PATH]
[--against TREE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from asyncloader._decode import _resize  # type: ignore[attr-defined]

Job = tuple[int, int, int, tuple[float, float, float, float], int, int]
"""Source width, height, channels, the box, output width, height."""
JOBS: dict[str, Job] = {
    "bucket 3:2": (427, 284, 4, (0.0, 0.0, 427.0, 284.0), 288, 192),
    "square crop": (427, 284, 4, (60.5, 0.0, 344.5, 284.0), 224, 224),
    "square whole": (427, 427, 4, (0.0, 0.0, 427.0, 427.0), 224, 224),
    "bucket 3:2 RGB": (427, 284, 3, (0.0, 0.0, 427.0, 284.0), 288, 192),
    "large to bucket": (1000, 700, 4, (0.0, 6.25, 1000.0, 672.9), 288, 192),
}
# Level 1 is NEON on AArch64 (its kernels are built there alone; SIMD is 1 at most).
LEVELS = {
    0: "scalar",
    1: "NEON" if platform.machine() in ("aarch64", "arm64") else "SSE4.1",
    2: "AVX2",
}


def _photo(w: int, h: int, channels: int) -> np.ndarray:
    """A smooth image with edges and grain (every weight shows in the pixels)."""
    rng = np.random.default_rng(w * h)
    y, x = np.mgrid[0:h, 0:w]
    planes = [x * 255 // w, y * 255 // h, (x * y // 7) % 256, np.full_like(x, 255)]
    base = np.stack(planes[:channels], -1) + rng.integers(-8, 9, (h, w, channels))
    return np.ascontiguousarray(np.clip(base, 0, 255).astype(np.uint8))


def _extension_of(tree: str) -> Any:
    """The ``_resize`` extension built in another checkout (``python setup.py build_ext
    --inplace`` there), loaded beside this one's: the same jobs, rounds and process."""
    found = sorted(Path(tree, "asyncloader", "_decode").glob("_resize.*.so"))
    if not found:
        raise SystemExit(f"no built _resize extension under {tree}/asyncloader/_decode")
    spec = importlib.util.spec_from_file_location("asyncloader._decode._resize", found[0])
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paths(job: Job, other: Any = None) -> dict[str, Callable[[], np.ndarray]]:
    """Pillow's path and each kernel level of this tree's extension; with ``other`` (another
    tree's: ``--against``), each of its levels too, named ``A <level>``."""
    w, h, c, box, ow, oh = job
    src = _photo(w, h, c)
    mode = "RGBX" if c == 4 else "RGB"
    img = Image.frombuffer(mode, (w, h), src.tobytes(), "raw", mode, 0, 1)
    out = np.empty((3, oh, ow), np.uint8)

    def pillow() -> np.ndarray:
        got = np.asarray(img.resize((ow, oh), Image.Resampling.BILINEAR, box=box))
        np.copyto(out, got[:, :, :3].transpose(2, 0, 1))
        return out

    def kernel(level: int, ext: Any = _resize) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            # Pillow 13 runs the vertical pass first where the height shrinks far more than
            # the width; none of these jobs does, so the horizontal pass goes first.
            ext.resize_into(src, w, h, c, box, out, ow, oh, False, False, level)
            return out

        return run

    paths: dict[str, Callable[[], np.ndarray]] = {"pillow": pillow}
    for level in range(int(_resize.SIMD) + 1):
        paths[LEVELS[level]] = kernel(level)
        if other is not None and level <= int(other.SIMD):
            paths[f"A {LEVELS[level]}"] = kernel(level, other)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--json", metavar="PATH", help="also write every round and the medians")
    p.add_argument(
        "--against",
        metavar="TREE",
        help="another checkout with its extension built: its kernels too, as 'A <level>'",
    )
    args = p.parse_args()
    other = _extension_of(args.against) if args.against else None
    with contextlib.suppress(OSError):  # one core: the figures are per core
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    report: dict[str, dict[str, object]] = {}
    print(f"CPU ms per call, medians of {args.rounds} rounds of {args.calls} calls; one core")
    for name, job in JOBS.items():
        paths = _paths(job, other)
        want = paths["pillow"]().copy()
        for path, run in paths.items():
            assert np.array_equal(run(), want), f"{name}: {path} differs from Pillow"
        times: dict[str, list[float]] = {path: [] for path in paths}
        for r in range(args.rounds):
            for path in list(paths) if r % 2 == 0 else list(paths)[::-1]:
                run = paths[path]
                t0 = time.process_time()
                for _ in range(args.calls):
                    run()
                times[path].append(1e3 * (time.process_time() - t0) / args.calls)
        medians = {path: statistics.median(v) for path, v in times.items()}
        w, h, c, _, ow, oh = job
        line = f"{name:16s} {w}x{h}x{c} -> {ow}x{oh}: " + ", ".join(
            f"{path} {ms:.3f}" for path, ms in medians.items()
        )
        best = LEVELS[int(_resize.SIMD)]
        line += f"; {best} / pillow {medians[best] / medians['pillow']:.2f}"
        if "SSE4.1" in medians:
            line += f", / SSE4.1 {medians[best] / medians['SSE4.1']:.2f}"
        for level in LEVELS.values():
            if f"A {level}" in medians:
                line += f"; {level} / A's {medians[level] / medians[f'A {level}']:.2f}"
        print(line)
        report[name] = {"job": job, "rounds": times, "median_ms": medians}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB; kernels this CPU runs: up to {LEVELS[int(_resize.SIMD)]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"cpu_ms_per_call": report, "peak_rss_mb": peak, "against": args.against},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
