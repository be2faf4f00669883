"""The start of a job against a web server: listing a caption folder by HEAD, a first
``warm``, and a loader's first epoch, each in a fresh process (a new client that knows
nothing of the server yet), against Python's ``http.server`` (HTTP/1.0: a connection per
request, a listen queue of five) and nginx (kept-alive connections) as the control.

The folder: ``--images`` of the demo's JPEGs with a ``metadata.jsonl`` of captions and no
sizes, so the listing asks each image's size by HEAD.  Cases, each a process of its own:

* ``list`` — ``asyncloader.describe(url)``: the metadata file, then a HEAD per image.
* ``pages`` — ``asyncloader.describe(url + "classes/")``: the same number of images in 20
  class folders without a metadata file, listed by the server's folder pages, then a HEAD
  per image (neither server's pages give exact sizes here).
* ``warm`` — ``asyncloader.warm(url, <a new cache folder>)``: the listing, then every image.
* ``epoch`` — an ``ImageLoader`` with ``extras=("text",)`` and a resize to 64, no cache: its
  first batch and its epoch (the listing's HEADs are asked as the run reads, beside its GETs).

Printed per server and case: wall seconds (and for ``epoch`` the first batch's), the
listen-queue overflows the kernel counted meanwhile (``TcpExtListenOverflows``, for the
whole machine: each a handshake dropped, resent by TCP a second later), CPU seconds per
image of the process and its children, and peak RSS.  With ``--before TREE`` (``git worktree
add TREE COMMIT``, its built ``*.so`` copied in) every case also runs on that tree in the same
round, and the ratio before / now of the wall times is printed.  Rounds interleave; medians.

Run: ``python benchmarks/bench_web_start.py [--images 500] [--rounds 5] [--cases
list,pages,warm,epoch] [--before TREE] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncloader as al
from asyncloader.testing import Nginx, PythonHTTPServer, make_jpeg_folder, tree_cpu_seconds


def _site(images: int, root: Path) -> Path:
    """A flat caption folder: the JPEGs and a metadata.jsonl without sizes."""
    src = make_jpeg_folder(root / "jpegs", images=images, classes=1, seed=1)
    site = root / "site"
    site.mkdir()
    rows = []
    for p in sorted(src.rglob("*.jpg")):
        shutil.copy(p, site / p.name)
        rows.append({"file_name": p.name, "text": f"photo {p.stem}"})
    (site / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    classes = make_jpeg_folder(root / "classes", images=images, classes=20, seed=2)
    (site / "classes").symlink_to(classes, target_is_directory=True)
    return site


def _nginx(root: Path) -> Nginx:
    """nginx serving ``root``, with its folder pages (autoindex) for the ``pages`` case."""
    return Nginx(root, server="autoindex on;")


def overflows() -> int:
    """The kernel's count of connections its listen queues dropped (every socket)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(row.get("ListenOverflows", 0))
    return 0


def run_case(case: str, url: str, work: str) -> dict[str, float]:
    """One case in this process (see the module's docstring)."""
    t0 = time.perf_counter()
    cpu0 = tree_cpu_seconds()
    first = 0.0
    if case == "list":
        n = al.describe(url).samples
    elif case == "pages":
        n = al.describe(url + "classes/").samples
    elif case == "warm":
        report = al.warm(url, Path(work) / "cache")
        assert not report.failed, report.failed
        n = report.warmed
    else:
        n = 0
        with al.ImageLoader(
            url, batch_size=32, labels=None, extras=("text",), transform=al.Resize(64)
        ) as loader:
            for images, _, _ in loader:  # type: ignore[misc]
                if not n:
                    first = time.perf_counter() - t0
                n += len(images)
    wall = time.perf_counter() - t0
    return {
        "images": n,
        "wall_s": wall,
        "first_s": first,
        "cpu_ms": 1e3 * (tree_cpu_seconds() - cpu0) / max(n, 1),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def one(case: str, url: str, tree: str | None) -> dict[str, float]:
    """``case`` in a process of its own; ``tree``: another source tree of asyncloader."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, env.get("PYTHONPATH"))))
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_web_start as b; "
        "print(json.dumps(b.run_case(sys.argv[2], sys.argv[3], sys.argv[4])))"
    )
    here = str(Path(__file__).resolve().parent)
    with tempfile.TemporaryDirectory() as work:
        before = overflows()
        out = subprocess.run(
            [sys.executable, "-c", code, here, case, url, work],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=env,
            cwd=tree,  # ``-c`` puts the working folder first on sys.path, before PYTHONPATH
        )
        dropped = overflows() - before
    if out.returncode:
        raise SystemExit(f"{case} failed:\n{out.stderr[-3000:]}")
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    got["overflows"] = dropped
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", default="list,pages,warm,epoch")
    p.add_argument("--servers", default="http.server,nginx")
    p.add_argument("--before", help="another source tree of asyncloader, run in each round")
    p.add_argument("--json")
    args = p.parse_args()
    trees: dict[str, str | None] = {"now": None}
    if args.before:
        trees["before"] = args.before
    servers = {"http.server": PythonHTTPServer, "nginx": _nginx}
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as root:
        site = _site(args.images, Path(root))
        for name in args.servers.split(","):
            with servers[name](site) as server:
                url = server.endpoint + "/"
                for _ in range(args.rounds):
                    for case in args.cases.split(","):
                        for who, tree in trees.items():
                            got = one(case, url, tree)
                            results.setdefault(f"{name} {case} {who}", []).append(got)
    medians: dict[str, dict[str, Any]] = {}
    print(f"{args.images} images, {args.rounds} rounds; medians (overflows: the whole machine's)")
    print("server       case   tree    wall s  first s  overflows  CPU ms/img  RSS MB  before/now")
    for key, runs in results.items():
        m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        medians[key] = {**m, "rounds": runs}
        name, case, who = key.split()
        ratio = ""
        if who == "now" and f"{name} {case} before" in results:
            b = statistics.median(r["wall_s"] for r in results[f"{name} {case} before"])
            ratio = f"{b / m['wall_s']:.2f}"
        print(
            f"{name:12s} {case:6s} {who:6s} {m['wall_s']:7.2f}  {m['first_s']:7.2f}  "
            f"{m['overflows']:9.0f}  {m['cpu_ms']:10.2f}  {m['rss_mb']:6.0f}  {ratio}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
