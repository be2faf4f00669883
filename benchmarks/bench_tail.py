"""asyncloader against a store that behaves like a real cloud store, each case against a
no-fault baseline measured in the same run.

Our light S3 server at 20 ms time to first byte, with:

* ``tail-1pct-2s`` — 1 % of requests wait 2 s more;
* ``tail-0.1pct-10s`` — 0.1 % of requests wait 10 s more;
* ``step-20-100ms`` — the latency steps from 20 to 100 ms a third into the epoch (the rate
  before the step, and from 2 s to 4 s after it: the case runs on, whole epochs, until then);
* ``rate-limit`` — a token bucket answers 503 SlowDown above ``--rate-limit`` requests/s;
* ``peer-baseline`` / ``peer-tail-1pct-2s`` — the peer users run today,
  ``torch.utils.data.DataLoader(num_workers=4)`` with boto3 per item and Pillow's decode
  (``bench_loader.py``'s ``dataloader`` case), without and with the 1 % tail (not in the
  default cases: ``--cases baseline,tail-1pct-2s,peer-baseline,peer-tail-1pct-2s``);
* ``node-shared`` / ``node-alone`` — ``--node-loaders`` loaders of one node (processes, one
  shard each, one cache folder, started together) against that same limit, with the node's
  shared budget (``FetchConfig.node_budget``) and without it: their goodput together and
  the 503s they received (one epoch each, into a fresh cache folder).

Printed per case: images/s and its ratio to the baseline, hedges as a share of requests,
request p50/p99, 503s received (throttled retries) as a share of requests, the p99 and
longest gap between two batches as the training loop sees them, CPU per image and peak
RSS; for the rate limit, the adaptive budget's back-offs and its limit at the end.  Each
case runs in its own process (one warm-up epoch, then one measured);
rounds interleave the cases; medians over rounds.  Run: ``python benchmarks/bench_tail.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl

BASE_LATENCY = 0.02
CASES = {
    "baseline": {},
    "tail-1pct-2s": {"rates": {"stall": 0.01}, "stall_seconds": 2.0},
    "tail-0.1pct-10s": {"rates": {"stall": 0.001}, "stall_seconds": 10.0},
    "step-20-100ms": {},  # the step happens mid-epoch, from the case itself
    "rate-limit": {},  # set from --rate-limit
    "node-shared": {},  # set from --rate-limit
    "node-alone": {},
}
NODE_CASES = ("node-shared", "node-alone")
# The peer's cases: the faults of the asyncloader case of the same name.
PEER_CASES = {"peer-baseline": "baseline", "peer-tail-1pct-2s": "tail-1pct-2s"}


def _set_faults(endpoint: str, **cfg: object) -> None:
    cfg.setdefault("rates", {})
    cfg.setdefault("max_faults_per_key", 1000)
    cfg.setdefault("latency", BASE_LATENCY)
    cfg.setdefault("rate_limit", 0)
    req = urllib.request.Request(
        f"{endpoint}/_control/faults", data=json.dumps(cfg).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def case(endpoint: str, name: str, batch: int, workers: int) -> dict[str, float]:
    import torch  # noqa: F401  (a training script has it: not part of the measured epoch)

    import asyncloader as al

    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        transform=al.RandomResizedCrop(224),
        decode=al.DecodeConfig(workers=workers),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        for batch in loader:  # warm-up epoch: connections, learned latencies
            del batch  # none kept: each slot goes back at once
        before = loader.stats()
        step_batch = len(loader) // 3  # the step early enough to see the recovery
        times: list[tuple[float, int]] = []
        step_at = None
        t0, c0 = time.perf_counter(), bl._cpu()
        n = epochs = 0
        while True:
            for i, (images, _) in enumerate(loader):
                n += len(images)
                times.append((time.perf_counter(), n))
                if name == "step-20-100ms" and epochs == 0 and i == step_batch:
                    _set_faults(endpoint, latency=0.1)
                    step_at = time.perf_counter()
            epochs += 1
            # The step case goes on, a whole epoch at a time, until its recovery can be
            # measured: the rate from 2 s after the step to 4 s after it.
            if step_at is None or time.perf_counter() >= step_at + 4.0 or epochs >= 10:
                break
        wall = time.perf_counter() - t0
        cpu = bl._cpu() - c0
        after = loader.stats()
    out = {
        "images": n,
        "wall": wall,
        "cpu": cpu,
        "requests": after.requests - before.requests,
        "hedges": after.hedges_sent - before.hedges_sent,
        "throttled": after.retries.get("throttled", 0) - before.retries.get("throttled", 0),
        "p50": after.request_p50,
        "p99": after.request_p99,
        "backoffs": after.backoffs - before.backoffs,
        "limit": after.inflight_limit,
    }
    # The gaps between batches, as the training loop sees them (a straggler that stalls the
    # stream shows as a long one).
    gaps = sorted(b[0] - a[0] for a, b in zip([(t0, 0), *times], times, strict=False))
    out["gap_p99"] = gaps[min(int(0.99 * len(gaps)), len(gaps) - 1)]
    out["gap_max"] = gaps[-1]
    if step_at is not None:
        pre = [(t, k) for t, k in times if t <= step_at]
        post = [(t, k) for t, k in times if step_at + 2.0 <= t <= step_at + 4.0]
        out["rate_before"] = (pre[-1][1] - pre[0][1]) / max(pre[-1][0] - pre[0][0], 1e-9)
        if len(post) > 1:
            out["rate_after"] = (post[-1][1] - post[0][1]) / max(post[-1][0] - post[0][0], 1e-9)
    return out


def node_member(endpoint: str, rank: int, loaders: int, shared: bool, cache: str) -> dict:  # type: ignore[type-arg]
    """One loader of a node: its shard of one epoch, fetched into the node's cache folder."""
    import asyncloader as al

    with al.ImageLoader(
        "s3://b/train/",
        batch_size=32,
        transform=al.CenterCrop(64),
        rank=rank,
        world_size=loaders,
        cache_dir=cache,
        fetch=al.FetchConfig(node_budget=shared),
        decode=al.DecodeConfig(workers=1),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        n = sum(len(images) for images, _ in loader)
        st = loader.stats()
    return {
        "images": n,
        "requests": st.requests,
        "throttled": st.retries.get("throttled", 0),
        "backoffs": st.backoffs,
        "followed": st.backoffs_followed,
        "members": st.node_loaders,
    }


def node_case(endpoint: str, shared: bool, loaders: int) -> dict[str, float]:
    """``loaders`` processes of one node started together; their sums, and the wall time
    from the first start to the last end."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-node-") as cache:
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    *(sys.executable, __file__, "--node-member", endpoint),
                    *(str(r), str(loaders), str(int(shared)), cache),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(loaders)
        ]
        outs = [p.communicate()[0] for p in procs]
        wall = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise RuntimeError("a node member failed")
    rows = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    total = {k: float(sum(r[k] for r in rows)) for k in rows[0]}
    total["members"] = max(r["members"] for r in rows)
    return {**total, "wall": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rate-limit", type=float, default=300.0, help="requests/s (case d)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of all cases")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated")
    p.add_argument("--data-dir", default=str(bl.ROOT / "cache" / "bench-jpegs-tail"))
    p.add_argument("--node-loaders", type=int, default=4, help="loaders of one node (node-*)")
    p.add_argument("--json", metavar="PATH", help="also write every round and the medians here")
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--node-member", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.node_member:
        endpoint, rank, loaders, shared, cache = args.node_member
        print(json.dumps(node_member(endpoint, int(rank), int(loaders), shared == "1", cache)))
        return
    if args.case:
        endpoint, name = args.case
        res = case(endpoint, name, args.batch_size, args.workers)
        res["rss_mb"] = bl._peak_rss_mb()
        print(json.dumps(res))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = Path(args.data_dir)
    make_jpeg_folder(folder, images=args.images, classes=10, seed=0)
    names = [n for n in args.cases.split(",") if n]
    common = ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
    rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with S3TestServer(latency=BASE_LATENCY, load=folder, bucket="b", prefix="train/") as srv:
        for r in range(args.repeat):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                cfg = dict(CASES[PEER_CASES.get(name, name)])
                if name == "rate-limit" or name in NODE_CASES:
                    cfg["rate_limit"] = args.rate_limit
                _set_faults(srv.endpoint, seed=r, **cfg)
                if name in NODE_CASES:
                    shared = name == "node-shared"
                    rows[name].append(node_case(srv.endpoint, shared, args.node_loaders))
                elif name in PEER_CASES:
                    peer = ["dataloader", srv.endpoint, "--data-dir", str(folder), *common]
                    rows[name].append(bl.run_case(peer))
                else:
                    rows[name].append(bl.run_case([srv.endpoint, name, *common], script=__file__))
                _set_faults(srv.endpoint)
                print(f"round {r + 1} {name}: {json.dumps(rows[name][-1])}", flush=True)
    med = statistics.median
    base = [x["images"] / x["wall"] for x in rows.get("baseline", [])]
    print(
        f"\n{int(med([x['images'] for x in rows[names[0]]]))} JPEGs, {args.workers} workers, "
        f"batch {args.batch_size}, "
        f"{os.cpu_count()} cores, {args.repeat} round(s), {BASE_LATENCY * 1e3:.0f} ms; medians, "
        "ratios to each round's baseline\n"
    )
    print(
        f"{'case':18s} {'img/s':>7s} {'x base':>7s} {'hedges':>7s} {'p50 ms':>7s} "
        f"{'p99 ms':>7s} {'503s':>6s} {'gap p99/max ms':>14s} {'CPU ms/img':>10s} "
        f"{'RSS MB':>7s}  other"
    )
    for name in names:
        rs = rows[name]
        if name in NODE_CASES or name in PEER_CASES:
            continue
        ips = [x["images"] / x["wall"] for x in rs]
        ratio = [a / b for a, b in zip(ips, base, strict=False)] if base else []
        other = ""
        if name == "step-20-100ms":
            before = [x["rate_before"] for x in rs]
            after = [x.get("rate_after", 0.0) for x in rs]
            other = (
                f"rate 2 s after the step / before: "
                f"{med([a / b for a, b in zip(after, before, strict=True)]):.2f}"
            )
        if name == "rate-limit":
            other = (
                f"goodput / limit: {med(ips) / args.rate_limit:.2f}; back-offs "
                f"{med([x['backoffs'] for x in rs]):.0f}, in-flight limit at the end "
                f"{med([x['limit'] for x in rs]):.0f}"
            )
        print(
            f"{name:18s} {med(ips):7.0f} {med(ratio) if ratio else float('nan'):7.2f} "
            f"{med([x['hedges'] / max(x['requests'], 1) for x in rs]):7.1%} "
            f"{med([x['p50'] for x in rs]) * 1e3:7.0f} {med([x['p99'] for x in rs]) * 1e3:7.0f} "
            f"{med([x['throttled'] / max(x['requests'], 1) for x in rs]):6.1%} "
            f"{med([x['gap_p99'] for x in rs]) * 1e3:7.0f}/"
            f"{max(x['gap_max'] for x in rs) * 1e3:<6.0f} "
            f"{med([x['cpu'] / x['images'] for x in rs]) * 1e3:10.2f} "
            f"{max(x['rss_mb'] for x in rs):7.0f}  {other}"
        )

    peers = [n for n in names if n in PEER_CASES]
    if peers:
        print("\nthe peer (DataLoader(num_workers=4) + boto3 per item), same server and faults:")
        for name in peers:
            rs = rows[name]
            ips = [x["images"] / x["wall"] for x in rs]
            cpu = med([x["cpu"] / x["images"] for x in rs]) * 1e3
            print(f"{name:18s} {med(ips):7.0f} img/s, {cpu:.2f} CPU ms/img")
    if args.json:
        bl.write_json(args.json, vars(args), rows)
    node = [n for n in names if n in NODE_CASES]
    if node:
        print(
            f"\n{args.node_loaders} loaders of one node against {args.rate_limit:.0f} requests/s "
            "(medians):\n"
            f"{'case':12s} {'img/s':>6s} {'goodput/limit':>13s} {'503s/requests':>13s} "
            f"{'back-offs':>9s} {'followed':>8s} {'members':>7s}"
        )
        for name in node:
            rs = rows[name]
            ips = med([x["images"] / x["wall"] for x in rs])
            print(
                f"{name:12s} {ips:6.0f} {ips / args.rate_limit:13.2f} "
                f"{med([x['throttled'] / max(x['requests'], 1) for x in rs]):13.1%} "
                f"{med([x['backoffs'] for x in rs]):9.0f} {med([x['followed'] for x in rs]):8.0f} "
                f"{med([x['members'] for x in rs]):7.0f}"
            )


if __name__ == "__main__":
    main()
