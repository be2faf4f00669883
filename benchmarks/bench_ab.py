"""An interleaved A/B of the loader between two source trees, in one run.

Each round runs ``bench_loader.py``'s ``asyncloader`` case once from tree A and once from
tree B (each a fresh process with that tree first on ``PYTHONPATH``), against one light S3
server with ``--latency`` seconds to first byte; medians of images/s and CPU ms per image,
and B's ratio to A.  Make tree A with ``git worktree add /tmp/a COMMIT`` (copy the built
``*.so`` extensions into it, or build them there).

Rounds alternate which tree goes first.

Run: ``python benchmarks/bench_ab.py /tmp/a . [--rounds 4] [--latency 0.02] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", help="tree A (the baseline)")
    p.add_argument("b", help="tree B")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--backend", default="thread", choices=("thread", "inline"))
    p.add_argument("--data-dir", default=str(HERE.parent / "cache" / "bench-jpegs"))
    p.add_argument("--json", metavar="PATH", help="also write every round and the medians")
    args = p.parse_args()

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0)
    trees = {"A": Path(args.a).resolve(), "B": Path(args.b).resolve()}
    runs: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    with S3TestServer(load=folder, bucket="b", prefix="train/", latency=args.latency) as srv:
        for r in range(args.rounds):
            # A then B, then B then A: neither always runs on the other's warm caches.
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                root = trees[name]
                env = dict(os.environ, PYTHONPATH=str(root))
                case = [srv.endpoint, args.backend, "--workers", str(args.workers)]
                out = subprocess.run(
                    [
                        sys.executable,
                        str(root / "benchmarks" / "bench_loader.py"),
                        "--case",
                        "asyncloader",
                        *case,
                        "--batch-size",
                        "128",
                        "--epochs",
                        "2",
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                r = json.loads(out.stdout.strip().splitlines()[-1])
                runs[name].append((r["images"] / r["wall"], r["cpu"] / r["images"] * 1e3))
                print(name, f"{runs[name][-1][0]:.0f} img/s, {runs[name][-1][1]:.3f} CPU ms/img")
    med = {n: [statistics.median(x[i] for x in rs) for i in (0, 1)] for n, rs in runs.items()}
    print(
        f"\n{args.rounds} interleaved rounds at {args.latency * 1e3:.0f} ms, {args.backend} backend"
    )
    for n in runs:
        print(f"{n} ({trees[n]}): {med[n][0]:.0f} img/s, {med[n][1]:.3f} CPU ms/img (medians)")
    # Paired: each round's B over that round's A (the two ran back to back), then the
    # median: a slow spell of this shared machine hits both sides of a pair alike.
    paired = [
        statistics.median(b[i] / a[i] for a, b in zip(runs["A"], runs["B"], strict=True))
        for i in (0, 1)
    ]
    print(
        f"B / A: images/s {med['B'][0] / med['A'][0]:.2f}, "
        f"CPU per image {med['B'][1] / med['A'][1]:.2f} (ratio of medians); "
        f"{paired[0]:.2f} and {paired[1]:.2f} (median of the rounds' ratios)"
    )
    if args.json:
        doc = {
            "trees": {n: str(t) for n, t in trees.items()},
            "latency": args.latency,
            "backend": args.backend,
            "rounds": {
                n: [{"images_per_s": a, "cpu_ms": c} for a, c in rs] for n, rs in runs.items()
            },
            "medians": {n: {"images_per_s": m[0], "cpu_ms": m[1]} for n, m in med.items()},
            "paired_ratio": {"images_per_s": paired[0], "cpu_ms": paired[1]},
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
