"""Bucketed batches against square ones of the same pixels per batch, and the header pass.

The folder: the demo's JPEGs cut to three aspect ratios (1:1, 3:2, 2:3; the long side about
the demo's) with a ``metadata.jsonl`` (a caption and a score, no width or height), on our
light S3 server.  Both cases read it through one warmed SSD cache (the decode and the
crop are what is compared, not the network), 2 decode workers, batches of 32:

* ``square`` — ``RandomResizedCrop(224)``: every batch ``[32, 3, 224, 224]`` (its crops
  cover 8–100 % of the image, about half on average: less of each image is decoded);
* ``cover`` — ``Resize(224)``: the shorter side to 224, the centre 224 × 224 cropped — the
  square bucket's geometry, a crop that covers the image;
* ``buckets`` — ``make_buckets(224 * 224, ratios=(0.5, 2.0), step=32)``: each image to
  the bucket nearest its shape (at most 224² pixels), every batch one bucket.

Each case runs in its own process (a loader, one epoch to start, then ``--epochs``
measured), the three alternating; rounds interleave; medians over rounds.  Printed:
images/s and the ratios to ``square`` and ``cover``, the loader's CPU seconds per image (its
process tree), peak RSS and the pixels per image delivered.  Then the header pass: from
the store (the images not cached), requests and bytes per image; a bucketed loader on a
cache that holds every image but no sizes (the headers are read there: no request); and
the same loader again, the sizes kept (no request); and a bucketed epoch on an empty cache:
its requests per image, header reads included (an image no larger than a header read is
fetched whole by it, and kept, so the epoch does not fetch it again).

``--long-side N``: each photo resized to a long side of N pixels first, as sources larger
than the training size are (a bucket's whole image is then decoded at 1/2 or 1/4 scale
where a square crop's box, a part of it, is decoded at a larger scale).

``--decode-alone``: no loader, no server: each case's decode and resize (``decode_into``,
as a decode worker runs it) over the same photos in this one process, pinned to one core
where it can be, rounds interleaved; and the region decode alone (``_jpegroi``, what the
crop needs at its DCT scale), so that what the loader adds and what the decode costs are
told apart; and a full-scale decode of each photo whole, of its top half, and of its bottom
half (the top half skipped: entropy-decoded, not transformed): what a crop cannot skip.
Printed: CPU ms per image and the ratio to ``square``, medians of the rounds.

``--megapixels M``: camera-sized photos instead, of about M megapixels in the three aspect
ratios (made from the demo's photos as ``make_jpeg`` makes them).  ``--scaled``: the cache
keeps each large JPEG's scaled copies (``CacheConfig(scaled_jpegs=True)`` in the epoch that
fills it), which every case then reads where its crop's scale has one.

Run: ``python benchmarks/bench_buckets.py [--images 1200] [--rounds 3] [--epochs 2]
[--long-side N | --megapixels M [--scaled]]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from PIL import Image

import asyncloader as al
from asyncloader.testing import TEST_ENV, S3TestServer, make_jpeg_folder, tree_cpu_seconds

SHAPES = ((1, 1), (2, 3), (3, 2))


def shaped_folder(root: Path, images: int, long_side: int = 0, megapixels: float = 0) -> Path:
    """The demo's photos cut to ``SHAPES``; ``long_side``: each then resized (LANCZOS) to
    that long side (0: as cut); ``megapixels``: photos of that size in ``SHAPES`` instead."""
    if megapixels:
        return _camera_folder(root, images, megapixels)
    out = root / (f"shaped-{images}" + (f"-{long_side}" if long_side else ""))
    if (out / "metadata.jsonl").exists():
        return out
    source = make_jpeg_folder(root / "jpegs", images=images)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, path in enumerate(sorted(source.glob("class_*/img_*.jpg"))):
        h, w = SHAPES[i % 3]
        with Image.open(path) as img:
            side = min(img.size)
            cut = img.crop((0, 0, side * w // max(h, w), side * h // max(h, w))).convert("RGB")
            if long_side:
                size = (long_side * w // max(h, w), long_side * h // max(h, w))
                cut = cut.resize(size, Image.Resampling.LANCZOS)
            cut.save(out / f"{i:05d}.jpg", quality=90)
        rows.append({"file_name": f"{i:05d}.jpg", "text": f"photo {i}", "score": i % 10})
    (out / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _camera_folder(root: Path, images: int, megapixels: float) -> Path:
    """``images`` photos of about ``megapixels`` in ``SHAPES`` (quality 90), with the
    metadata file."""
    from asyncloader.testing._demo import make_jpeg, source_photos

    out = root / f"camera-{images}-{megapixels:g}mp"
    if (out / "metadata.jsonl").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    photos = source_photos()
    rows = []
    for i in range(images):
        h, w = SHAPES[i % 3]
        side = (megapixels * 1e6 / (h * w)) ** 0.5
        size = (round(side * w), round(side * h))
        (out / f"{i:05d}.jpg").write_bytes(make_jpeg(photos, i, size=size))
        rows.append({"file_name": f"{i:05d}.jpg", "text": f"photo {i}", "score": i % 10})
    (out / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _options(case: str, endpoint: str, cache: str) -> dict[str, Any]:
    shape: dict[str, Any] = (
        {"buckets": al.make_buckets(224 * 224, ratios=(0.5, 2.0), step=32)}
        if case == "buckets"
        else {"transform": al.Resize(224) if case == "cover" else al.RandomResizedCrop(224)}
    )
    return {
        "batch_size": 32,
        "labels": None,
        "cache_dir": cache,
        "decode": al.DecodeConfig(workers=2),
        "store": al.StoreConfig(options={"endpoint_url": endpoint}),
        **shape,
    }


def run_case(case: str, endpoint: str, cache: str, epochs: int) -> dict[str, float]:
    """In this process: one epoch to start (listing, sizes, engines), then ``epochs``
    measured."""
    with al.ImageLoader("s3://b/train/", **_options(case, endpoint, cache)) as loader:
        for _ in loader:
            pass
        cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
        images = pixels = 0
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            for x, _ in loader:
                images += len(x)
                pixels += x.shape[2] * x.shape[3] * len(x)
        wall, cpu = time.perf_counter() - t0, tree_cpu_seconds() - cpu0
        stats = loader.stats()
    return {
        "images_per_s": images / wall,
        "cpu_ms_per_image": 1e3 * cpu / images,
        "pixels_per_image": pixels / images,
        "from_copies": stats.cache_scaled_hits / max(stats.decoded, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def decode_alone(folder: Path, rounds: int) -> dict[str, dict[str, float]]:
    """Each case's per-image CPU in one process: ``decode_into`` (the region decode and
    the resize, as a decode worker runs them) and the region decode alone [ms]."""
    import random

    import numpy as np

    from asyncloader._decode import _image
    from asyncloader._decode._transforms import bucket_plan

    with contextlib.suppress(OSError):  # one core: the figures are per core
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    datas = [f.read_bytes() for f in sorted(folder.glob("*.jpg"))]
    sizes = []
    for data in datas:
        with Image.open(io.BytesIO(data)) as img:
            sizes.append(img.size)
    buckets = _options("buckets", "", "")["buckets"]
    nearest = buckets.nearest([h for _, h in sizes], [w for w, _ in sizes])
    transforms: dict[str, Any] = {"square": al.RandomResizedCrop(224), "cover": al.Resize(224)}

    def plan(case: str, i: int) -> tuple[Any, Any, Any]:
        w, h = sizes[i]
        if case == "buckets":
            bh, bw = buckets.sizes[nearest[i]]
            spec = _image.DecodeSpec((3, bh, bw), buckets=buckets)
            mark = (bh, bw, h, w)
            return spec, mark, bucket_plan(w, h, (bh, bw), random.Random(i))[0]
        t = transforms[case]
        spec = _image.DecodeSpec((3, 224, 224), transform=t)
        return spec, None, t.plan(w, h, random.Random(i))

    # Each sample's spec, mark and plan, made once, outside the timed loops.
    plans = {c: [plan(c, i) for i in range(len(datas))] for c in ("square", "cover", "buckets")}

    def whole(case: str) -> float:
        outs = [np.empty(spec.sample_shape, np.uint8) for spec, _, _ in plans[case]]
        t0 = time.process_time()
        for i, (data, (spec, mark, _), out) in enumerate(
            zip(datas, plans[case], outs, strict=True)
        ):
            _image.decode_into(data, out, spec, i, "k", mark)
        return 1e3 * (time.process_time() - t0) / len(datas)

    def region(case: str) -> float:
        t0 = time.process_time()
        for data, (w, h), (_, _, p) in zip(datas, sizes, plans[case], strict=True):
            scale = _image._jpeg_scale(w, h, p.box, p.size)[1]
            _image._decode_region(data, scale, w, h, p.box, p.size)
        return 1e3 * (time.process_time() - t0) / len(datas)

    def rows(part: str) -> float:
        """A decode at full scale of the whole image, its top half, or its bottom half
        (the top half skipped: entropy-decoded, not transformed)."""
        t0 = time.process_time()
        for data, (w, h) in zip(datas, sizes, strict=True):
            y0, y1 = {"whole": (0, h), "top half": (0, h // 2), "bottom half": (h // 2, h)}[part]
            _image._jpegroi.decode(data, 1, 0, y0, w, y1)  # type: ignore[union-attr]
        return 1e3 * (time.process_time() - t0) / len(datas)

    runs: dict[str, list[float]] = {}
    cases = ["square", "cover", "buckets"]
    for r in range(rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            runs.setdefault(case, []).append(whole(case))
            runs.setdefault(case + " region", []).append(region(case))
        for part in ("whole", "top half", "bottom half"):
            runs.setdefault(f"decode: {part}", []).append(rows(part))
    return {k: {"cpu_ms_per_image": statistics.median(v)} for k, v in runs.items()}


def header_pass(endpoint: str, cache: str, objects: int) -> dict[str, float]:
    """The header pass from the store (the images not cached: ``sample_sizes`` itself, on
    the loader's store, with a folder of its own), then a bucketed loader on a cache holding
    every image and no sizes (the headers read there: its requests are header reads, if
    any), then the same loader again (the sizes kept)."""
    import asyncio

    from asyncloader._base._stats import Counters
    from asyncloader._dataset._sizes import sample_sizes
    from asyncloader._stores import open_store

    async def from_store() -> Counters:
        store = open_store("s3://b/train/", endpoint_url=endpoint)
        counters = Counters()
        try:
            images = [o async for o in store.list() if o.key.endswith(".jpg")]
            with tempfile.TemporaryDirectory() as folder:
                await sample_sizes(
                    store, images, [None] * len(images), folder=folder, counters=counters
                )
        finally:
            await store.close()
        counters.objects_listed = len(images)
        return counters

    cold = asyncio.run(from_store())
    out: dict[str, float] = {
        "store_requests_per_object": cold.requests / cold.objects_listed,
        "store_bytes_per_object": cold.bytes_fetched / cold.objects_listed,
    }
    # A bucketed epoch on a cache of its own, empty: the header pass's requests and the
    # epoch's together (an image that its header's read fetched whole is not fetched again).
    with (
        tempfile.TemporaryDirectory() as empty,
        al.ImageLoader("s3://b/train/", **_options("buckets", endpoint, empty)) as loader,
    ):
        delivered = sum(len(images) for images, _ in loader)
        stats = loader.stats()
    out["cold_epoch_requests_per_image"] = (stats.requests - 1) / cold.objects_listed
    out["cold_epoch_bytes_per_image"] = stats.bytes_fetched / cold.objects_listed
    out["cold_epoch_images"] = delivered
    for run in ("first", "again"):
        with al.ImageLoader("s3://b/train/", **_options("buckets", endpoint, cache)) as loader:
            next(iter(loader))
            stats = loader.stats()
        out[f"{run}_requests_per_object"] = stats.requests / objects
        out[f"{run}_bytes_per_object"] = stats.bytes_fetched / objects
    return out


def _child(argv: list[str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *argv], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--long-side",
        type=int,
        default=0,
        help="resize each photo to this long side first (0: the demo's, about 427)",
    )
    p.add_argument(
        "--megapixels",
        type=float,
        default=0,
        help="camera-sized photos of about this many megapixels instead (0: the demo's)",
    )
    p.add_argument(
        "--scaled",
        action="store_true",
        help="the cache keeps each large JPEG's scaled copies, read by every case",
    )
    p.add_argument(
        "--decode-alone",
        action="store_true",
        help="each case's decode and resize in this one process: no loader, no server",
    )
    p.add_argument("--data-dir", default="cache/bench-buckets")
    p.add_argument("--json", default="")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        what, endpoint, cache, n = args.child
        if what == "headers":
            print(json.dumps(header_pass(endpoint, cache, int(n))))
        else:
            print(json.dumps(run_case(what, endpoint, cache, int(n))))
        return
    for k, v in TEST_ENV.items():
        os.environ.setdefault(k, v)
    folder = shaped_folder(Path(args.data_dir), args.images, args.long_side, args.megapixels)
    if args.decode_alone:
        alone = decode_alone(folder, args.rounds)
        base = alone["square"]["cpu_ms_per_image"]
        print(
            f"{args.images} images in 3 aspect ratios, decoded in one process on one core "
            f"(no loader); medians of {args.rounds} rounds"
        )
        for case, m in alone.items():
            ms = m["cpu_ms_per_image"]
            ratio = base / ms if " " not in case else float("nan")
            print(
                f"{case:21s} {ms:6.3f} CPU ms/img"
                + (f"  ({ratio:.2f} x square's rate)" if " " not in case else "")
            )
        if args.json:
            Path(args.json).write_text(
                json.dumps({"args": vars(args), "decode_alone": alone}, indent=1)
            )
        return
    rows: dict[str, list[dict[str, float]]] = {"square": [], "cover": [], "buckets": []}
    server = S3TestServer(load=folder, bucket="b", prefix="train/")
    with server, tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "cache")
        # Fill the cache (and its listing) with an unbucketed epoch: no sizes kept.
        with al.ImageLoader(
            "s3://b/train/", **_options("square", server.endpoint, cache)
        ) as loader:
            for _ in loader:
                pass
        # Every object cached (a loader leaves out what its cache writer cannot keep up
        # with), and with --scaled, every large JPEG's copies made.
        al.warm(
            "s3://b/train/",
            cache,
            store_options={"endpoint_url": server.endpoint},
            scaled_jpegs=args.scaled,
        )
        # Warm keeps the sizes of what it read: dropped, so that the header pass reads them.
        for kept in (Path(cache) / "listings").glob("*.sizes.npz"):
            kept.unlink()
        headers = _child(["headers", server.endpoint, cache, str(args.images + 1)])
        for _ in range(args.rounds):
            for case in ("square", "cover", "buckets"):
                rows[case].append(_child([case, server.endpoint, cache, str(args.epochs)]))
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in rows.items()}
    base, cover = med["square"]["images_per_s"], med["cover"]["images_per_s"]
    what = (
        f"photos of ~{args.megapixels:g} MP" + (", with scaled copies" if args.scaled else "")
        if args.megapixels
        else f"long side {args.long_side or 'as cut'}"
    )
    print(
        f"{args.images} images in 3 aspect ratios ({what}), batches of 32, 2 decode workers, "
        f"from the SSD cache; medians of {args.rounds} rounds of {args.epochs} epochs"
    )
    for case, m in med.items():
        print(
            f"{case:8s} {m['images_per_s']:7.0f} img/s ({m['images_per_s'] / base:.2f} x square, "
            f"{m['images_per_s'] / cover:.2f} x cover)  "
            f"{m['cpu_ms_per_image']:.2f} CPU ms/img  {m['pixels_per_image']:.0f} px/img  "
            f"{100 * m['from_copies']:.0f} % from copies  "
            f"peak RSS {m['peak_rss_mb']:.0f} MB"
        )
    print(
        f"header pass from the store: {headers['store_requests_per_object']:.2f} requests and "
        f"{headers['store_bytes_per_object'] / 1024:.1f} KiB per image; on a cache holding "
        f"the images (no sizes kept): {headers['first_requests_per_object']:.2f} requests per "
        f"object; again: {headers['again_requests_per_object']:.2f} requests"
    )
    print(
        f"a bucketed epoch on an empty cache: {headers['cold_epoch_requests_per_image']:.2f} "
        f"requests and {headers['cold_epoch_bytes_per_image'] / 1024:.1f} KiB per image, "
        "header reads included (the metadata file's request left out)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"args": vars(args), "rounds": rows, "medians": med, "headers": headers}, indent=1
            )
        )


if __name__ == "__main__":
    main()
