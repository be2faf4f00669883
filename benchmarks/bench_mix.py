"""Two sources mixed 1:1 against the same images read as one source, in one run.

One light S3 server (``--latency`` to first byte) holds two folders of ``--images`` / 2
JPEGs each, ``train/a/`` and ``train/b/``.  Each round runs, in a fresh process each and in
alternating order:

* ``one`` — ``ImageLoader("s3://b/train/")``: both folders as one source;
* ``mix`` — ``ImageLoader([Source("s3://b/train/a/", weight=1), Source("s3://b/train/b/",
  weight=1)], samples_per_epoch=--images)``: the same images, mixed 1:1.

The steady state after a first epoch is measured (images/s, CPU ms per image of every
process of the loader, peak RSS); the ratio mix / one is per round, then the median.

Run: ``python benchmarks/bench_mix.py [--rounds 6] [--latency 0.02] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_loader import _cpu, _peak_rss_mb, run_case, write_json  # noqa: E402


def case(
    kind: str, endpoint: str, images: int, batch: int, workers: int, epochs: int
) -> dict[str, float]:
    import asyncloader as al

    options = {"endpoint_url": endpoint}
    if kind == "one":
        url: object = "s3://b/train/"
        extra: dict[str, object] = {}
    else:
        url = [al.Source(f"s3://b/train/{half}/", weight=1.0) for half in "ab"]
        extra = {"samples_per_epoch": images}
    with al.ImageLoader(
        url,  # type: ignore[arg-type]
        batch_size=batch,
        transform=al.RandomResizedCrop(224),
        **extra,
        decode=al.DecodeConfig(workers=workers),
        store=al.StoreConfig(options=options),  # type: ignore[arg-type]
    ) as loader:
        for batch in loader:  # epoch 0: start-up, connections
            del batch  # none kept: each slot goes back at once
        t0, c0 = time.perf_counter(), _cpu()
        n = 0
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            n += sum(len(x[0]) for x in loader)
        wall = time.perf_counter() - t0
    return {"images": n, "wall": wall, "cpu": _cpu() - c0, "rss_mb": _peak_rss_mb()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--data-dir", default=str(HERE.parent / "cache" / "bench-mix-jpegs"))
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        kind, endpoint = args.case
        res = case(kind, endpoint, args.images, args.batch_size, args.workers, args.epochs)
        print(json.dumps(res))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    root = Path(args.data_dir)
    for seed, half in enumerate("ab"):
        make_jpeg_folder(root / half, images=args.images // 2, classes=10, seed=seed)
    common = ["--images", str(args.images), "--workers", str(args.workers)]
    common += ["--batch-size", str(args.batch_size), "--epochs", str(args.epochs)]
    rows: dict[str, list[dict[str, float]]] = {"one": [], "mix": []}
    with S3TestServer(latency=args.latency, load=root, bucket="b", prefix="train/") as srv:
        for r in range(args.rounds):
            for kind in ("one", "mix") if r % 2 == 0 else ("mix", "one"):
                got = run_case([kind, srv.endpoint, *common], script=__file__)
                rows[kind].append(got)
                print(
                    f"round {r} {kind}: {got['images'] / got['wall']:.0f} img/s, "
                    f"{got['cpu'] / got['images'] * 1e3:.2f} CPU ms/img",
                    flush=True,
                )
    med = statistics.median
    ips = {k: [x["images"] / x["wall"] for x in v] for k, v in rows.items()}
    cpu = {k: [x["cpu"] / x["images"] * 1e3 for x in v] for k, v in rows.items()}
    per_round = [m / o for m, o in zip(ips["mix"], ips["one"], strict=True)]
    print(
        f"\n{args.images} JPEGs, {args.latency * 1e3:.0f} ms, {args.workers} workers, "
        f"{os.cpu_count()} cores, {args.rounds} rounds (medians)"
    )
    for k in ("one", "mix"):
        rss = max(x["rss_mb"] for x in rows[k])
        print(f"{k:4s} {med(ips[k]):7.0f} img/s  {med(cpu[k]):6.2f} CPU ms/img  {rss:6.0f} MB")
    print(
        f"mix / one: {med(ips['mix']) / med(ips['one']):.3f} x images/s (median of rounds "
        f"{med(per_round):.3f}), {med(cpu['mix']) / med(cpu['one']):.3f} x CPU per image"
    )
    if args.json:
        write_json(args.json, vars(args), rows)


if __name__ == "__main__":
    main()
