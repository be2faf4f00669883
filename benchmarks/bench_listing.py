"""Time to the first batch of a large prefix: unshuffled (the listing streams) vs shuffled
(the whole listing first), against our light S3 server with ``--latency`` per request.

Two layouts of ``--objects`` small JPEGs: one flat folder (paginated, 1000 keys a page,
one page after another) and ``--folders`` class folders (listed in parallel).  For each,
the loader's ``first_batch_seconds`` and ``listing_seconds`` (from ``stats()``), median of
``--repeat`` runs.  Then the client CPU per listed key of the flat folder: aiobotocore's
``list_objects_v2`` paginator against ``S3Store.list()``.
Run: ``python benchmarks/bench_listing.py``.

``--million`` (issue #17's scale): ``--keys`` (default 1 000 000) keys on the light server's
synthetic bucket (names, sizes and ETags only; every body one small JPEG), ``--latency`` per
page, in 1000 class folders and flat.  Each measure runs in a fresh process: the time to the
first batch of a shuffled run from a cold listing and from a published manifest (``ls
--write-manifest``, as JSONL rows and as arrays, ``.npz``), the client CPU per listed key
and the memory the object list holds (``asyncloader.listing``), and the LIST requests a
``torchrun`` job of 2 ranks × 2 DataLoader workers sends, against one listing's.
Run: ``python benchmarks/bench_listing.py --million``.
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
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
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


def case_held(endpoint: str) -> dict[str, float]:
    """``asyncloader.listing`` in this fresh process: client CPU per key, wall time, and
    the memory the returned list holds (resident, after collection)."""
    import gc
    import time

    import asyncloader as al

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    gc.collect()
    r0, c0, t0 = rss(), time.process_time(), time.perf_counter()
    objects = al.listing("s3://b/train/", store_options={"endpoint_url": endpoint})
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    gc.collect()
    nbytes = getattr(objects, "nbytes", lambda: float("nan"))()
    return {
        "keys": len(objects),
        "cpu_us_per_key": cpu / len(objects) * 1e6,
        "wall": wall,
        "held_mb": rss() - r0,
        "arrays_mb": nbytes / 1e6,
    }


def case_first(endpoint: str, labels: str, batch: int) -> dict[str, float]:
    """Seconds from making a shuffled loader to its first batch (``labels``: "folder", or
    a manifest file to read instead of listing)."""
    import time

    import torch  # noqa: F401 -- a training script has it imported before the loader starts

    import asyncloader as al

    t0 = time.perf_counter()
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        labels=labels,
        transform=al.Resize(32),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        next(iter(loader))
        return {"first": time.perf_counter() - t0, "samples": len(loader.dataset.samples)}


JOB = """
import sys, torch.distributed as dist
from torch.utils.data import DataLoader
from asyncloader.torch import ImageDataset
if __name__ == "__main__":
    dist.init_process_group("gloo")
    ds = ImageDataset("s3://b/train/", batch_size=64, decode_workers=1,
                      store_options={"endpoint_url": sys.argv[1]})
    for i, _ in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
        if i == 3:
            break
    dist.barrier()
    dist.destroy_process_group()
"""


def job_lists(endpoint: str, server: object, tmp: Path) -> tuple[int, int]:
    """(LIST requests of one listing, of a torchrun job of 2 ranks × 2 workers)."""
    import subprocess

    from asyncloader.testing import free_port

    server.reset_stats()  # type: ignore[attr-defined]
    bl.run_case([endpoint, "held"], __file__)
    one = server.stats()["counters"].get("list", 0)  # type: ignore[attr-defined]
    server.reset_stats()  # type: ignore[attr-defined]
    script = tmp / "job.py"
    script.write_text(JOB)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script), endpoint],
        check=True, capture_output=True, timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return one, server.stats()["counters"].get("list", 0)  # type: ignore[attr-defined]


def million(args: argparse.Namespace) -> None:
    import json

    from asyncloader.testing import S3TestServer

    print(
        f"{args.keys} keys, {args.latency * 1e3:.0f} ms per request, batch {args.batch_size},"
        f" median of {args.repeat} (each in a fresh process)\n"
    )
    head = (
        f"{'layout':14s} {'cold: 1st batch s':>17s} {'jsonl: 1st s':>12s} {'npz: 1st s':>10s} "
        f"{'CPU us/key':>10s} {'list s':>7s} {'held MB':>8s} {'arrays MB':>9s}"
    )
    print(head)
    with tempfile.TemporaryDirectory() as tmp:
        for folders in (1000, 0):
            layout = f"{folders} folders" if folders else "flat"
            with S3TestServer(
                latency=args.latency,
                bucket="b",
                prefix="train/",
                synthetic=args.keys,
                synthetic_folders=folders,
            ) as srv:
                manifest = Path(tmp) / f"train-{folders}.jsonl"
                columnar = manifest.with_suffix(".npz")
                import asyncloader as al

                for path in (manifest, columnar):
                    al.describe(
                        "s3://b/train/",
                        store_options={"endpoint_url": srv.endpoint},
                        write_manifest=path,
                    )
                rounds = []
                for _ in range(args.repeat):  # interleaved: cold, manifest, held
                    b = str(args.batch_size)
                    cold = bl.run_case([srv.endpoint, "first", "folder", b], __file__)
                    man = bl.run_case([srv.endpoint, "first", str(manifest), b], __file__)
                    npz = bl.run_case([srv.endpoint, "first", str(columnar), b], __file__)
                    held = bl.run_case([srv.endpoint, "held"], __file__)
                    rounds.append((cold, man, held, npz))

                def m(i: int, k: str, rs: list[tuple[dict[str, float], ...]] = rounds) -> float:
                    return statistics.median(r[i][k] for r in rs)

                print(
                    f"{layout:14s} {m(0, 'first'):17.2f} {m(1, 'first'):12.2f} "
                    f"{m(3, 'first'):10.2f} "
                    f"{m(2, 'cpu_us_per_key'):10.2f} {m(2, 'wall'):7.2f} "
                    f"{m(2, 'held_mb'):8.0f} {m(2, 'arrays_mb'):9.0f}"
                )
                if folders and args.torchrun:
                    one, job = job_lists(srv.endpoint, srv, Path(tmp))
                    lists = {"one_listing": one, "job_2x2": job}
        if args.torchrun:
            print(
                f"\nLIST requests, 1000 folders: one listing {lists['one_listing']}, a torchrun "
                f"job of 2 ranks x 2 workers {lists['job_2x2']} "
                f"({lists['job_2x2'] / max(1, lists['one_listing']):.2f} listings)"
            )
        print(json.dumps({"rounds": args.repeat}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=20_000)
    p.add_argument("--folders", type=int, default=100)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--million", action="store_true", help="the 1M-key measures (see above)")
    p.add_argument("--keys", type=int, default=1_000_000, help="with --million")
    p.add_argument("--no-torchrun", dest="torchrun", action="store_false", help="skip the 2x2 job")
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        import json

        endpoint, order, *rest = args.case
        if order == "cpu":
            res = case_cpu(endpoint)
        elif order == "held":
            res = case_held(endpoint)
        elif order == "first":
            res = case_first(endpoint, rest[0], int(rest[1]))
        else:
            res = case(endpoint, order == "shuffled", args.batch_size)
        print(json.dumps(res))
        return
    if args.million:
        from asyncloader.testing import TEST_ENV

        os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
        million(args)
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
