"""asyncloader against web servers as they are deployed, each against ``requests`` with 16
threads on the same server in the same run (what a user would try first).

* ``limit-req`` — nginx with ``limit_req`` at ``--rate`` requests/s and no burst (a strict
  leaky bucket, ``nodelay``: a request over the rate is refused at once with 503).  The
  figure that matters is goodput: requests the server took (answered, not refused) per
  second of the measured epoch, against the limit, and the share of requests refused.
  Images delivered per second are printed too; for the loader they can run above the
  goodput, and the limit, where the epoch before had fetched ahead into the measured one.
* ``http-server`` — Python's ``http.server`` (HTTP/1.0: a connection per request, a small
  accept queue).  The figures: images/s, and requests that waited a second or more.

Both serve the demo's JPEG folder with a manifest naming every image with its size (no
HEADs).  Each case runs in its own process, asyncloader (``ImageLoader`` with a resize to
64: the fetch is what is measured; a warm-up epoch, then one measured, no cache) and the
``requests`` baseline (16 threads, a session each: every image once) alternating; rounds
interleave; medians over rounds.  Printed per case:
images/s and its ratio to the baseline, refused requests as a share of all, CPU seconds
per image (the loader's process tree) and peak RSS.

``--pin``: the server on CPU 0 and the client on the others (``sched_setaffinity``), as
when the server is another machine: the server's own scheduling (nginx reads its clock once
per wake-up, in whole milliseconds) no longer waits behind the client's decoding.

``--before TREE``: the loader from another source tree too (``git worktree add TREE
COMMIT``, the built ``*.so`` copied into it), a third process in each round: a change's A/B.

Run: ``python benchmarks/bench_servers.py [--cases limit-req,http-server] [--rate 150]
[--images 1500] [--rounds 3] [--pin] [--before TREE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncloader as al
from asyncloader.testing import Nginx, PythonHTTPServer, make_jpeg_folder, tree_cpu_seconds


def _site(images: int, root: Path) -> Path:
    folder = make_jpeg_folder(root / "jpegs", images=images, classes=10)
    site = root / "site"
    site.mkdir(exist_ok=True)
    if not (site / "train").exists():
        (site / "train").symlink_to(folder, target_is_directory=True)
    rows = [
        {"key": p.relative_to(folder).as_posix(), "size": p.stat().st_size}
        for p in sorted(folder.rglob("*.jpg"))
    ]
    (site / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return site


def run_loader(endpoint: str) -> dict[str, float]:
    """Two epochs of the site by asyncloader (in this process and its engines), the second
    measured: the loader started and listed, every image fetched again (no cache)."""
    store = al.StoreConfig(options={"manifest": f"{endpoint}/train.jsonl"})
    with al.ImageLoader(
        f"{endpoint}/train/", batch_size=64, transform=al.Resize(64), store=store
    ) as loader:
        for _ in loader:  # the warm-up epoch
            pass
        before = loader.stats()
        t0 = time.perf_counter()
        cpu0 = tree_cpu_seconds()
        n = sum(len(labels) for _, labels in loader)
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds() - cpu0
        stats = loader.stats()
    requests = stats.requests - before.requests
    refused = stats.retries.get("throttled", 0) - before.retries.get("throttled", 0)
    return {
        "images": n,
        "img_s": n / wall,
        "requests": requests,
        "refused": refused / max(requests, 1),
        "served_s": (requests - refused) / wall,
        "p99_ms": 1e3 * stats.request_p99,
        "cpu_ms": 1e3 * cpu / n,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_requests(endpoint: str, threads: int = 16) -> dict[str, float]:
    """The same images by ``requests``, ``threads`` threads, a session each, retrying a
    refused request after 50 ms (what a user's loop does)."""
    import threading

    import requests

    rows = [json.loads(line) for line in (Path(_ROOT) / "site" / "train.jsonl").open()]
    local = threading.local()
    counts = {"requests": 0, "refused": 0}
    lock = threading.Lock()

    def get(key: str) -> int:
        session = getattr(local, "s", None) or requests.Session()
        local.s = session
        while True:
            resp = session.get(f"{endpoint}/train/{key}", timeout=60)
            with lock:
                counts["requests"] += 1
                counts["refused"] += resp.status_code in (429, 503)
            if resp.status_code == 200:
                return len(resp.content)
            time.sleep(0.05)

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    with ThreadPoolExecutor(threads) as ex:
        n = len(list(ex.map(get, (r["key"] for r in rows))))
    wall = time.perf_counter() - t0
    return {
        "images": n,
        "img_s": n / wall,
        "requests": counts["requests"],
        "refused": counts["refused"] / max(counts["requests"], 1),
        "served_s": (counts["requests"] - counts["refused"]) / wall,
        "cpu_ms": 1e3 * (time.process_time() - cpu0) / n,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


_ROOT = ""


_CLIENT_CPUS: set[int] | None = None  # --pin: where the client runs (the server on CPU 0)


def _pin_client() -> None:
    if _CLIENT_CPUS:
        os.sched_setaffinity(0, _CLIENT_CPUS)


def _pin_server(pid: int | None) -> None:
    if _CLIENT_CPUS and pid is not None:
        os.sched_setaffinity(pid, {0})


def one(case: str, who: str, endpoint: str, tree: str | None = None) -> dict[str, float]:
    """One measurement in a process of its own (its CPU and memory its own); ``tree``: a
    source tree of asyncloader to run instead of the installed one (``--before``)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, env.get("PYTHONPATH"))))
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_servers as b; "
        "b._ROOT = sys.argv[2]; print(json.dumps(getattr(b, 'run_' + sys.argv[3])(sys.argv[4])))"
    )
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", code, here, _ROOT, who, endpoint],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        cwd=tree,  # ``-c`` puts the working folder first on sys.path, before PYTHONPATH
        preexec_fn=_pin_client,
    )
    if out.returncode:
        raise SystemExit(f"{case} {who} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    global _ROOT, _CLIENT_CPUS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="limit-req,http-server")
    p.add_argument("--rate", type=int, default=150)
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pin", action="store_true", help="the server on CPU 0, clients on the rest")
    p.add_argument("--json")
    p.add_argument(
        "--before",
        metavar="TREE",
        help="also run the loader from this source tree (git worktree add TREE COMMIT; copy "
        "the built *.so into it), in the same rounds: a change's A/B",
    )
    args = p.parse_args()
    if args.pin:
        _CLIENT_CPUS = os.sched_getaffinity(0) - {0}
        if not _CLIENT_CPUS:
            raise SystemExit("--pin needs two CPUs or more")
    with tempfile.TemporaryDirectory(prefix="bench-servers-") as tmp:
        _ROOT = tmp
        site = _site(args.images, Path(tmp))
        results: dict[str, dict[str, list[dict[str, float]]]] = {}
        for case in args.cases.split(","):
            names = ["asyncloader", "requests"] + (["before"] if args.before else [])
            results[case] = {name: [] for name in names}
            for _ in range(args.rounds):
                for name in names:
                    who = "requests" if name == "requests" else "loader"
                    tree = args.before if name == "before" else None
                    if case == "limit-req":
                        zone = f"zone=one:1m rate={args.rate}r/s"
                        http = f"limit_req_zone $binary_remote_addr {zone};"
                        with Nginx(site, http=http, server="limit_req zone=one nodelay;") as n:
                            _pin_server(n.pid)
                            got = one(case, who, n.endpoint, tree)
                    else:
                        with PythonHTTPServer(site) as server:
                            _pin_server(server.pid)
                            got = one(case, who, server.endpoint, tree)
                    results[case][name].append(got)
        print(
            f"{'case':12} {'who':12} {'img/s':>8} {'ratio':>6} {'refused':>8} "
            f"{'CPU ms/img':>10} {'RSS MB':>7}"
        )
        for case, by in results.items():
            base = statistics.median(r["img_s"] for r in by["requests"])
            for who, rows in by.items():
                med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                limit = med["served_s"] / args.rate
                extra = f"  (goodput {med['served_s']:.1f}/s: {limit:.2f} x the limit)"
                extra = extra if case == "limit-req" else ""
                print(
                    f"{case:12} {who:12} {med['img_s']:8.1f} {med['img_s'] / base:6.2f} "
                    f"{med['refused']:8.1%} {med['cpu_ms']:10.2f} {med['rss_mb']:7.0f}{extra}"
                )
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
