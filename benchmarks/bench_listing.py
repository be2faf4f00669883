"""Time to the first batch of a large prefix: unshuffled (the listing streams) vs shuffled
(the whole listing first), against our light S3 server with ``--latency`` per request.

Two layouts of ``--objects`` small JPEGs: one flat folder (paginated, 1000 keys a page,
one page after another) and ``--folders`` class folders (listed in parallel).  For each,
the loader's ``first_batch_seconds`` and ``listing_seconds`` (from ``stats()``), median of
``--repeat`` runs.  Then the client CPU per listed key of the flat folder: aiobotocore's
``list_objects_v2`` paginator against ``S3Store.list()``.
Run: ``python benchmarks/bench_listing.py``.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl


def make_tree(root: Path, objects: int, folders: int) -> Path:
    """``objects`` copies of one small JPEG (hard links), in ``folders`` folders (0: flat)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 60, 30)).save(buf, "JPEG")
    src = root / "one.jpg"
    src.write_bytes(buf.getvalue())
    tree = root / f"tree-{folders}"
    for i in range(objects):
        folder = tree / (f"class_{i % folders:04d}" if folders else "")
        folder.mkdir(parents=True, exist_ok=True)
        os.link(src, folder / f"img_{i:07d}.jpg")
    return tree


def case(endpoint: str, shuffle: bool, batch: int) -> dict[str, float]:
    import torch  # noqa: F401 -- a training script has it imported before the loader starts

    import asyncloader as al

    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        shuffle=shuffle,
        transform=al.Resize(32),
        store_options={"endpoint_url": endpoint},
    ) as loader:
        next(iter(loader))
        first = loader.stats().first_batch_seconds
        listing = loader.dataset and loader.stats().listing_seconds  # waits for the listing
    return {"first": first or 0.0, "listing": listing}


def case_cpu(endpoint: str) -> dict[str, float]:
    """Client CPU per key of listing s3://b/train/ both ways (the server is elsewhere)."""
    import asyncio
    import time

    from aiobotocore.session import get_session

    from asyncloader import S3Store

    async def run() -> dict[str, float]:
        store = S3Store("b", "train/", endpoint_url=endpoint)
        async with get_session().create_client("s3", endpoint_url=endpoint) as client:

            async def botocore() -> int:
                pages = client.get_paginator("list_objects_v2").paginate(
                    Bucket="b", Prefix="train/"
                )
                return sum([len(page.get("Contents", ())) async for page in pages])

            async def ours() -> int:
                return sum([1 async for _ in store.list()])

            out: dict[str, float] = {}
            try:
                for name, fn in (("botocore", botocore), ("ours", ours)):
                    await fn()  # warm: clients, credentials, connections
                    c0 = time.process_time()
                    n = await fn()
                    out[name] = (time.process_time() - c0) / n
            finally:
                await store.close()
            return out

    return asyncio.run(run())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=20_000)
    p.add_argument("--folders", type=int, default=100)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        import json

        endpoint, order = args.case
        res = (
            case_cpu(endpoint)
            if order == "cpu"
            else case(endpoint, order == "shuffled", args.batch_size)
        )
        print(json.dumps(res))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    print(
        f"{args.objects} objects, {args.latency * 1e3:.0f} ms per request, batch "
        f"{args.batch_size}, median of {args.repeat}\n"
    )
    print(f"{'layout':22s} {'order':10s} {'first batch s':>13s} {'listing s':>10s}")
    with tempfile.TemporaryDirectory() as tmp:
        for folders in (0, args.folders):
            tree = make_tree(Path(tmp), args.objects, folders)
            layout = f"{folders} folders" if folders else "flat"
            with S3TestServer(latency=args.latency, load=tree, bucket="b", prefix="train/") as srv:
                for order in ("unshuffled", "shuffled"):
                    runs = [
                        bl.run_case(
                            [srv.endpoint, order, "--batch-size", str(args.batch_size)], __file__
                        )
                        for _ in range(args.repeat)
                    ]
                    first = statistics.median(r["first"] for r in runs)
                    listing = statistics.median(r["listing"] for r in runs)
                    print(f"{layout:22s} {order:10s} {first:13.2f} {listing:10.2f}")
                if not folders:
                    cpu = bl.run_case([srv.endpoint, "cpu"], __file__)
        print(
            f"\nclient CPU per listed key: aiobotocore paginator {cpu['botocore'] * 1e6:.1f} us, "
            f"S3Store.list() {cpu['ours'] * 1e6:.1f} us ({cpu['botocore'] / cpu['ours']:.1f}x less)"
        )


if __name__ == "__main__":
    main()
