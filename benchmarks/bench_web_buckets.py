"""A bucketed caption folder on a web server (nginx), its first run: what the server is asked.

The folder: the demo's photos cut to three aspect ratios (``bench_buckets.py``'s
``shaped_folder``) with a ``metadata.jsonl`` without sizes (a web server has no listing:
the file names the images), served by nginx (Debian's).  A loader with aspect-ratio
buckets (``make_buckets(224 * 224)``, batches of 32, captions) runs one epoch from an
empty cache folder each time, in two cases that alternate in each round, each on an
nginx of its own:

* ``head-then-header`` — each image sized by a HEAD, then its header read (a GET of its
  first 64 KiB), then the epoch: what a loader did before its sizing GET read the
  header too (here the same store with ``stat_listed_heads`` hidden);
* ``header-sizes`` — today's loader: one GET of each image's first 64 KiB gives its size,
  its ETag and its header; an image no larger comes whole and the cache keeps it.

``--long-side N`` resizes each photo to a long side of N pixels first (896: every photo
over 64 KiB, so each is read twice, its first bytes and then whole).

Printed per case (medians of the rounds): HEADs and GETs per image and the bytes sent per
image (nginx's access log), the seconds to the first batch and to the end of the epoch
with their ratios to ``head-then-header`` in the same round (after one epoch not
measured), the CPU seconds per image (this process and its engine processes) and the peak
RSS of this process.

Run: ``python benchmarks/bench_web_buckets.py [--images 1200] [--rounds 3] [--long-side N]
[--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench_buckets import shaped_folder
from bench_web_filters import round_medians, timed_epoch

import asyncloader as al
from asyncloader._stores._web import HttpStore
from asyncloader.testing import Nginx, find_nginx


class HeadThenHeader(HttpStore):
    """The web store as a loader sized it before: a HEAD for each image."""

    stat_listed_heads = None  # type: ignore[assignment]


def _epoch(store: HttpStore, cache: Path) -> tuple[float, float, float, int]:
    """One bucketed epoch with captions: as :func:`bench_web_filters.timed_epoch`."""
    buckets = al.make_buckets(224 * 224)
    return timed_epoch(store, cache, batch_size=32, labels=None, buckets=buckets, extras=("text",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long-side", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if find_nginx() is None:
        raise SystemExit("nginx not found: apt-get install nginx-light")
    root = Path(tempfile.mkdtemp(prefix="bench-web-buckets-"))
    folder = shaped_folder(root, args.images, args.long_side)
    sizes = {f"/{p.name}": p.stat().st_size for p in folder.glob("*.jpg")}
    over = sum(s > 64 * 1024 for s in sizes.values())
    cases = {"head-then-header": HeadThenHeader, "header-sizes": HttpStore}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    with Nginx(folder) as server:  # one epoch not measured: the imports, the first engines
        _epoch(HttpStore(server.endpoint + "/"), root / "cache-warm-up")
    for r in range(args.rounds):
        for case in list(cases) if r % 2 == 0 else list(cases)[::-1]:
            with Nginx(folder) as server:
                store = cases[case](server.endpoint + "/")
                first, total, cpu, n = _epoch(store, root / f"cache-{case}-{r}")
                answers = [a for a in server.answers() if a.path in sizes]
            count = Counter(a.method for a in answers)
            runs[case].append(
                {
                    "heads_per_image": count["HEAD"] / len(sizes),
                    "gets_per_image": count["GET"] / len(sizes),
                    "kib_per_image": sum(a.body_bytes for a in answers) / len(sizes) / 1024,
                    "first_batch_s": first,
                    "epoch_s": total,
                    "cpu_ms_per_image": 1000 * cpu / max(n, 1),
                }
            )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mean_kib = sum(sizes.values()) / len(sizes) / 1024
    print(
        f"{len(sizes)} photos (mean {mean_kib:.1f} KiB, {over} over 64 KiB) on nginx, one "
        f"bucketed epoch from an empty cache; medians of {args.rounds} rounds; peak RSS "
        f"{peak_mb:.0f} MB"
    )
    ratios = {"epoch_s": "epoch_x_before", "first_batch_s": "first_batch_x_before"}
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cases": {}}
    for case, med in round_medians(runs, "head-then-header", ratios).items():
        out["cases"][case] = med
        print(
            f"{case:17s} per image {med['heads_per_image']:.2f} HEAD "
            f"{med['gets_per_image']:.2f} GET {med['kib_per_image']:.1f} KiB; first batch "
            f"{med['first_batch_s']:.2f} s ({med['first_batch_x_before']:.2f} x), epoch "
            f"{med['epoch_s']:.2f} s ({med['epoch_x_before']:.2f} x); CPU "
            f"{med['cpu_ms_per_image']:.2f} ms/image"
        )
    out["peak_rss_mb"] = peak_mb
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
