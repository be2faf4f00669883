"""The header pass over many images: its client CPU and memory, apart from the network.

A bucketed run (or a ``width``/``height`` filter) with a metadata file that has no sizes
reads each image's header once per job (``_dataset/_headers.py``).  This reads the
headers of ``--images`` objects from an in-memory store that answers at once (the same
small JPEG under every key: what is measured is the client's own work), in a process of
its own per case, so that each peak RSS is that case's:

* ``now`` — the package as it is;
* ``--before TREE`` — the same from another source tree too (``git worktree add TREE
  COMMIT``), alternating with ``now`` in each round.

Printed (medians of the rounds): wall seconds, CPU microseconds per image, and the peak
RSS of the process above its RSS before the pass (MB), with the ratios of ``now`` to
``before``.

Run: ``python benchmarks/bench_header_pass.py [--images 200000] [--rounds 3]
[--before TREE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = """
import asyncio, hashlib, io, json, resource, sys, time
from PIL import Image
import asyncloader
from asyncloader._base._types import ObjectInfo
from asyncloader._dataset._headers import read_headers
from asyncloader.testing import MemoryBucket, MemoryStore

n = int(sys.argv[1])
buf = io.BytesIO()
Image.new("RGB", (64, 48), (10, 20, 30)).save(buf, "JPEG")
data = buf.getvalue()
bucket = MemoryBucket()
for i in range(n):
    bucket.put(f"{i:07d}.jpg", data)  # one bytes object under every key
etag = hashlib.md5(data).hexdigest()
objects = [ObjectInfo(f"{i:07d}.jpg", len(data), etag) for i in range(n)]
store = MemoryStore(bucket)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu0, t0 = time.process_time(), time.perf_counter()
found, failed = asyncio.run(read_headers(store, objects, None, None, stays=None))
cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
assert len(found) == n and not failed
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": wall, "cpu_us_per_image": 1e6 * cpu / n,
                  "peak_rss_mb": (peak - before) / 1024, "package": asyncloader.__file__}))
"""


def _case(tree: Path | None, images: int) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    # From a folder of its own: ``-c`` puts the working folder first on the path, where a
    # source tree would shadow ``tree``.
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(images)],
        env=env,
        cwd=tempfile.gettempdir(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cases: dict[str, Path | None] = {"now": None}
    if args.before is not None:
        cases["before"] = args.before
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for case in list(cases) if r % 2 == 0 else list(cases)[::-1]:
            runs[case].append(_case(cases[case], args.images))
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cases": {}}
    print(f"header pass over {args.images} objects, medians of {args.rounds} rounds")
    for case, rows in runs.items():
        figures = [k for k in rows[0] if k != "package"]
        med = {k: statistics.median(row[k] for row in rows) for k in figures}
        out["cases"][case] = {**med, "package": rows[0]["package"]}
        line = (
            f"{case:7s} {med['wall_s']:.2f} s, {med['cpu_us_per_image']:.1f} CPU us/image, "
            f"peak RSS +{med['peak_rss_mb']:.0f} MB"
        )
        if case == "now" and "before" in runs:
            b = {k: statistics.median(row[k] for row in runs["before"]) for k in figures}
            line += (
                f"  (x before: CPU {med['cpu_us_per_image'] / b['cpu_us_per_image']:.2f}, "
                f"RSS {med['peak_rss_mb'] / max(b['peak_rss_mb'], 1e-9):.2f})"
            )
        print(line + f"  [{rows[0]['package']}]")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
