"""The header pass by image format: requests and bytes per object, and what fails.

A bucketed run (or a ``width``/``height`` filter) over a metadata file without sizes reads
each image's header once per job (``_dataset/_headers.py``, ``_dataset/_imagesize.py``).
Pillow opens a JPEG or a PNG from its first bytes, but a WebP or an AVIF only whole.  This
makes ``--images`` photos of each format (the demo's photos, resized to a long side of
``--long-side`` in three aspect ratios and saved as JPEG, WebP, lossless WebP, AVIF and
PNG), puts them in an in-memory store that counts what it is asked, and reads their
headers, as stored and upright (``exif_orientation=True``), in a process per package:

* ``now`` — the package as it is;
* ``--before TREE`` — another source tree (``git worktree add TREE COMMIT``, its C
  extensions copied in), the baseline.

Printed for each format and package: GET requests per object, KiB per object, the images
whose header pass failed (a bucketed run stops at its start on the first), and the
client's CPU milliseconds per image; with the ratios of ``now`` to ``before``; and each
process's peak RSS.

Run: ``python benchmarks/bench_header_formats.py [--images 60] [--long-side 1024]
[--before TREE] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = """
import asyncio, hashlib, json, resource, sys, time
from pathlib import Path
import asyncloader
from asyncloader._base._stats import Counters
from asyncloader._base._types import ObjectInfo
from asyncloader._dataset._headers import read_headers
from asyncloader.testing import MemoryStore

folder = Path(sys.argv[1])
out = {"package": asyncloader.__file__}
for fmt_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
    data = {p.name: p.read_bytes() for p in sorted(fmt_dir.iterdir())}
    objects = [ObjectInfo(k, len(d), hashlib.md5(d).hexdigest()) for k, d in data.items()]
    for upright in (False, True):
        store = MemoryStore(data, name=fmt_dir.name)
        counters = Counters()
        cpu0 = time.process_time()
        found, failed = asyncio.run(
            read_headers(store, objects, counters, None, stays=None, upright=upright)
        )
        cpu = time.process_time() - cpu0
        n = len(objects)
        out[f"{fmt_dir.name}/{'upright' if upright else 'stored'}"] = {
            "requests_per_object": store.requests["get"] / n,
            "kib_per_object": counters.bytes_fetched / 1024 / n,
            "mean_object_kib": sum(map(len, data.values())) / 1024 / n,
            "failed": len(failed),
            "cpu_ms_per_image": 1e3 * cpu / n,
        }
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""

FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    "jpeg": ("JPEG", {"quality": 92}),
    "webp": ("WEBP", {"quality": 90}),
    "webp-lossless": ("WEBP", {"lossless": True}),
    "avif": ("AVIF", {"quality": 80}),
    "png": ("PNG", {}),
}


def make_images(folder: Path, n: int, long_side: int) -> None:
    """``n`` photos of each format under ``folder/<format>/``: the demo's JPEGs, resized to
    a long side of ``long_side`` in the ratios 1:1, 3:2 and 2:3."""
    from PIL import Image

    from asyncloader.testing._demo import make_jpeg, source_photos

    photos = source_photos()
    rng = random.Random(0)
    for i in range(n):
        w, h = rng.choice([(1, 1), (3, 2), (2, 3)])
        size = (long_side * w // max(w, h), long_side * h // max(w, h))
        img = Image.open(io.BytesIO(make_jpeg(photos, i, size=size)))
        for name, (fmt, kw) in FORMATS.items():
            (folder / name).mkdir(exist_ok=True)
            ext = {"JPEG": "jpg", "WEBP": "webp", "AVIF": "avif", "PNG": "png"}[fmt]
            img.save(folder / name / f"{i:05d}.{ext}", fmt, **kw)


def run(package: str | None, folder: Path) -> dict[str, Any]:
    """The child's figures for the package of source tree ``package`` (None: this one)."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = package
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=package or None,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--long-side", type=int, default=1024)
    ap.add_argument("--before", help="a source tree to compare with (the baseline)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_images(folder, args.images, args.long_side)
        results = {"now": run(None, folder)}
        if args.before:
            results["before"] = run(args.before, folder)
    print(f"{args.images} photos per format, long side {args.long_side}")
    print(
        f"{'format / sizes':28s} {'package':8s} {'KiB/object':>10s} {'GETs/object':>11s} "
        f"{'KiB read':>9s} {'failed':>6s} {'CPU ms':>7s}"
    )
    for case in (k for k in results["now"] if k not in ("package", "peak_rss_mb")):
        for package, figures in results.items():
            f = figures[case]
            print(
                f"{case:28s} {package:8s} {f['mean_object_kib']:10.1f} "
                f"{f['requests_per_object']:11.2f} {f['kib_per_object']:9.1f} "
                f"{f['failed']:6d} {f['cpu_ms_per_image']:7.2f}"
            )
        if "before" in results:
            now, before = results["now"][case], results["before"][case]
            ratio = now["kib_per_object"] / before["kib_per_object"]
            print(f"{'':28s} {'× before':8s} {'':10s} {'':11s} {ratio:9.2f}")
    for package, figures in results.items():
        print(f"peak RSS of the {package} process: {figures['peak_rss_mb']:.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=1))


if __name__ == "__main__":
    main()
