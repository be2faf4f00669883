"""12-megapixel photos from the SSD cache, with and without their scaled copies.

In one run, against our light S3 server at ``--latency`` (20 ms), with the photos
``bench_decode.py`` makes (4000×3000, from the demo's real photos):

1. ``warm`` into two cache folders: one plain, one with ``scaled_jpegs=True`` (objects/s,
   CPU per photo: what making the copies costs, once);
2. a loader (threads, RandomResizedCrop(224)) reading ``--epochs`` epochs from each cache,
   after an untimed first epoch; the two alternate over ``--rounds`` rounds.  Printed:
   images/s and CPU per image, medians, and the ratio of each round's scaled run to the
   plain run next to it; peak RSS.

Run: ``python benchmarks/bench_scaled.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode import make_photos
from bench_loader import ROOT, _cpu


def run_loader(endpoint: str, cache_dir: Path, epochs: int) -> tuple[float, float, int]:
    """Images/s and CPU seconds per image over ``epochs`` epochs from the cache (after an
    untimed one), and the samples decoded from scaled copies."""
    import asyncloader as al

    with al.ImageLoader(
        "s3://b/photos/",
        batch_size=4,
        shuffle=True,
        seed=1,
        transform=al.RandomResizedCrop(224),
        cache_dir=cache_dir,
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        for batch in loader:  # the first epoch: start-up, all hits already
            del batch  # none kept: each slot goes back at once
        t0, c0, n = time.perf_counter(), _cpu(), 0
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            n += sum(len(x) for x, _ in loader)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        return n / wall, cpu / n, loader.stats().cache_scaled_hits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--photos", type=int, default=12)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency", type=float, default=0.02)
    args = p.parse_args()

    import asyncloader as al
    from asyncloader.testing import TEST_ENV, S3TestServer

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    work = Path(tempfile.mkdtemp(prefix="bench-scaled-"))
    try:
        folder = work / "photos"
        for i, path in enumerate(make_photos(ROOT / "cache" / "bench-12mp", args.photos)):
            (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            shutil.copy(path, folder / f"c{i % 2}" / path.name)
        with S3TestServer(
            latency=args.latency, load=folder, bucket="b", prefix="photos/"
        ) as server:
            opts = {"endpoint_url": server.endpoint}
            warmed = {}
            for name, scaled in (("plain", False), ("scaled", True)):
                c0 = _cpu()
                report = al.warm(
                    "s3://b/photos/", work / name, store_options=opts, scaled_jpegs=scaled
                )
                warmed[name] = (report, (_cpu() - c0) / max(report.warmed, 1))
            runs: dict[str, list[tuple[float, float, int]]] = {"plain": [], "scaled": []}
            for r in range(args.rounds):
                for name in ("plain", "scaled") if r % 2 == 0 else ("scaled", "plain"):
                    runs[name].append(run_loader(server.endpoint, work / name, args.epochs))
                print(f"round {r + 1} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{args.photos} photos of 12 MP, RandomResizedCrop(224), {args.epochs} epochs from "
        f"the SSD cache per run, {args.rounds} interleaved rounds, medians; peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB\n"
    )
    for name, (report, cpu) in warmed.items():
        print(f"warm {name:6s}: {report.summary()}; {cpu * 1e3:.0f} ms of CPU per photo")
    print(f"\n{'cache':8s} {'images/s':>9s} {'CPU ms/img':>10s} {'from copies':>12s}")
    for name, xs in runs.items():
        print(
            f"{name:8s} {statistics.median(x[0] for x in xs):9.1f} "
            f"{statistics.median(x[1] for x in xs) * 1e3:10.2f} "
            f"{statistics.median(x[2] for x in xs):12.0f}"
        )
    pairs = list(zip(runs["scaled"], runs["plain"], strict=True))
    rate = [s[0] / p[0] for s, p in pairs]
    cpu = [s[1] / p[1] for s, p in pairs]
    print(
        f"\nscaled / plain: images/s {statistics.median(rate):.2f} "
        f"(rounds {', '.join(f'{x:.2f}' for x in rate)}); CPU per image "
        f"{statistics.median(cpu):.2f} (rounds {', '.join(f'{x:.2f}' for x in cpu)})"
    )


if __name__ == "__main__":
    main()
