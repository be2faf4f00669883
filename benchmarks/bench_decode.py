"""Decode + transform per image: the whole-image Pillow path against the region decode.

Sets, each decoded from bytes in RAM in this one process (CPU time is per core):

* ``imagenet-rrc`` — the ImageNet-like folder (~110 KB, ~476×426), RandomResizedCrop(224);
* ``photo12mp-rrc`` — 12-megapixel photos (4000×3000, made from the demo's real photos by
  the demo's ``make_jpeg``: random crops, upscaled, colour and grain), RandomResizedCrop(224);
* ``imagenet-center`` — the ImageNet-like folder, CenterCrop(224) after resize 256 (eval).

Paths: ``pillow`` (today's: Pillow decodes the whole image, at 1/2–1/8 scale where the crop
allows, and resizes) and ``roi`` (``_decode/_jpegroi``: only the crop's rows and iMCU
columns, same scale rule; then ``_decode/_resize``: Pillow's resize bit for bit, straight
into the sample's planes).  For the 12-megapixel set, also ``scaled``: the roi path reading
each sample from the photo's scaled copy for the crop's DCT scale (1/4 or 1/8; what a hit
from the SSD cache reads with ``cache_scaled_jpegs`` or ``warm --scaled-jpegs``), the
object itself where the crop needs a larger scale; the copies' one-time cost and size are
printed below the table.  All paths give the same pixels.  Rounds interleave the paths (the
order flips each round); printed: CPU ms per image and images/s per core (medians), and the
median of each round's path/pillow CPU ratio.
Run: ``python benchmarks/bench_decode.py [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import ROOT, _files


def make_photos(root: Path, count: int, size: tuple[int, int] = (4000, 3000)) -> list[Path]:
    """``count`` 12-megapixel JPEGs made from the demo's real photos as the demo makes its
    folder (made once)."""
    from asyncloader.testing._demo import make_jpeg, source_photos

    root.mkdir(parents=True, exist_ok=True)
    marker = root / ".complete.json"
    params = {"count": count, "size": list(size), "version": 2}
    paths = [root / f"photo_{i:03d}.jpg" for i in range(count)]
    if marker.exists() and json.loads(marker.read_text()) == params:
        return paths
    photos = source_photos()
    for i, path in enumerate(paths):
        path.write_bytes(make_jpeg(photos, i, size=size))
    marker.write_text(json.dumps(params))
    return paths


def measure(
    datas: list[bytes],
    transform: object,
    path: str,
    passes: int,
    copies: list[dict[int, bytes]] | None = None,
) -> float:
    """CPU seconds per image of decode + transform into a sample (one core); ``path``
    ``"scaled"`` decodes from ``copies`` (per image: scale → copy) where the crop's scale
    has one, as a worker does on a cache hit (the header read for the scale included)."""
    from asyncloader._decode import DecodeSpec, decode_into
    from asyncloader._decode._image import decode_scale

    h, w = transform.output_size  # type: ignore[attr-defined]
    spec = DecodeSpec((3, h, w), transform=transform, roi=path != "pillow")  # type: ignore[arg-type]
    out = np.empty((3, h, w), np.uint8)
    c0 = time.process_time()
    for p in range(passes):
        for i, data in enumerate(datas):
            seed = p * 100_003 + i
            if path == "scaled" and copies is not None:
                data = copies[i].get(decode_scale(data, spec, seed), data)
            decode_into(data, out, spec, seed, "k")
    return (time.process_time() - c0) / (passes * len(datas))


def make_copies(datas: list[bytes]) -> tuple[list[dict[int, bytes]], float]:
    """Each photo's scaled copies (scale → bytes), and the CPU seconds per photo they took."""
    from asyncloader._decode import scaled_copies, scaled_name

    c0 = time.process_time()
    made = [dict(scaled_copies(d)) for d in datas]
    cpu = (time.process_time() - c0) / len(datas)
    return [{s: m[scaled_name(s)] for s in (4, 8) if scaled_name(s) in m} for m in made], cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--images", type=int, default=300, help="ImageNet-like files used")
    p.add_argument("--photos", type=int, default=12, help="12-megapixel photos")
    args = p.parse_args()

    import asyncloader as al
    from asyncloader._decode import ROI_DECODE
    from asyncloader.testing._demo import make_jpeg_folder

    if not ROI_DECODE:
        sys.exit("the _jpegroi extension is not built here (libjpeg-turbo headers missing?)")
    folder = make_jpeg_folder(ROOT / "cache" / "bench-jpegs", images=1500, classes=10, seed=0)
    imagenet = [f.read_bytes() for f in _files(folder)[: args.images]]
    photos = [f.read_bytes() for f in make_photos(ROOT / "cache" / "bench-12mp", args.photos)]
    sets = {
        "imagenet-rrc": (imagenet, al.RandomResizedCrop(224), 2),
        "photo12mp-rrc": (photos, al.RandomResizedCrop(224), 2),
        "imagenet-center": (imagenet, al.CenterCrop(224), 2),
    }
    paths = {name: ["pillow", "roi"] for name in sets}
    paths["photo12mp-rrc"].append("scaled")
    copies, copy_cpu = make_copies(photos)
    for name, (datas, tf, _) in sets.items():  # warm up: imports, allocator, caches
        for path in paths[name]:
            measure(datas[:10], tf, path, 1, copies)
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name, (datas, tf, passes) in sets.items():
            for path in paths[name] if r % 2 == 0 else paths[name][::-1]:
                cpu.setdefault((name, path), []).append(measure(datas, tf, path, passes, copies))
        print(f"round {r + 1} done", file=sys.stderr, flush=True)
    kb = {n: statistics.mean(len(d) for d in s[0]) / 1e3 for n, s in sets.items()}
    print(
        f"\ndecode + transform from RAM, one core, {args.rounds} interleaved rounds; medians; "
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB\n"
    )
    print(
        f"{'set':16s} {'~KB':>6s} {'path':7s} {'CPU ms/img':>10s} {'img/s/core':>10s} "
        f"{'x pillow':>9s}"
    )
    for name in sets:
        base = cpu[(name, "pillow")]
        for path in paths[name]:
            xs = cpu[(name, path)]
            ratio = statistics.median(a / b for a, b in zip(xs, base, strict=True))
            med = statistics.median(xs)
            print(
                f"{name:16s} {kb[name]:6.0f} {path:7s} {med * 1e3:10.2f} "
                f"{1 / med:10.0f} {ratio:9.2f}"
            )
    size = sum(len(d) for d in photos)
    share = {s: sum(len(c.get(s, b"")) for c in copies) / size for s in (4, 8)}
    print(
        f"\nscaled copies of the 12 MP photos: made once in {copy_cpu * 1e3:.0f} CPU ms per "
        f"photo ({copy_cpu / statistics.median(cpu[('photo12mp-rrc', 'pillow')]):.1f} x a "
        f"pillow decode); 1/4 copy {share[4]:.0%} and 1/8 copy {share[8]:.0%} of the photos' "
        "bytes"
    )


if __name__ == "__main__":
    main()
