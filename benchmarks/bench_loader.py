"""asyncloader against the decode ceiling and a plain DataLoader + boto3, in one run.

Cases (each in its own subprocess, so CPU time and peak RSS are its own):

* ``ceiling-thread`` / ``ceiling-process`` — decode + RandomResizedCrop(224) from bytes
  already in RAM, the whole image through Pillow (as the peers decode), in a thread pool /
  process pool of ``--workers``; the better one is the decode ceiling.  The loader decodes
  only the crop's region where it can (``_decode/_jpegroi``), so it can pass the ceiling.
* ``dataloader`` — ``torch.utils.data.DataLoader(num_workers=4)`` over a map-style dataset
  that calls boto3 ``get_object`` per item and decodes it the same way.
* ``asyncloader`` — ``ImageLoader`` (thread decode in its engine process; ``--inline`` the
  engine in the measured process, ``EngineConfig(mode="inline")``, as every loader ran
  before engine processes)
  over ``s3://``; the steady state after a first epoch is measured, and the time from the
  loader's construction to its first batch (``first s``).

Storage is our light S3-compatible server (a subprocess; a fraction of a millisecond of CPU per
GET) with 0, 20 and 50 ms time to first byte.  Run: ``python benchmarks/bench_loader.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _cpu() -> float:
    """CPU seconds of this process and every process below it, live or ended (engine
    processes, DataLoader workers): see tree_cpu_seconds."""
    from asyncloader.testing import tree_cpu_seconds

    return tree_cpu_seconds()


def _peak_rss_mb() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (s + c) / 1024  # children: the largest one, which is what one worker costs


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.jpg"))


def _decode_one(args: tuple[bytes, int]) -> int:
    from asyncloader import RandomResizedCrop
    from asyncloader._decode import DecodeSpec, decode_into

    data, i = args
    out = np.empty((3, 224, 224), np.uint8)
    # Whole-image decode through Pillow (as every peer decodes), not our region decode.
    decode_into(data, out, DecodeSpec((3, 224, 224), RandomResizedCrop(224), roi=False), i, "k")
    return i


def case_ceiling(folder: Path, workers: int, kind: str, epochs: int = 1) -> dict[str, float]:
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    datas = [p.read_bytes() for p in _files(folder)]
    jobs = [(d, i) for i, d in enumerate(datas)] * epochs
    pool_cls = ThreadPoolExecutor if kind == "thread" else ProcessPoolExecutor
    with pool_cls(workers) as ex:
        list(ex.map(_decode_one, jobs[: workers * 4]))  # warm up (and start processes)
        t0, c0 = time.perf_counter(), _cpu()
        list(ex.map(_decode_one, jobs, chunksize=1 if kind == "thread" else 16))
        wall = time.perf_counter() - t0
    cpu = _cpu() - c0  # process workers were joined above, so their CPU is counted
    return {"images": len(jobs), "wall": wall, "cpu": cpu}


def case_dataloader(folder: Path, endpoint: str, batch: int) -> dict[str, float]:
    import boto3
    import torch
    from torch.utils.data import DataLoader, Dataset

    keys = [p.relative_to(folder).as_posix() for p in _files(folder)]

    class Boto3Images(Dataset[tuple[torch.Tensor, int]]):
        def __init__(self) -> None:
            self.client = None

        def __len__(self) -> int:
            return len(keys)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            if self.client is None:  # one client per worker process
                self.client = boto3.client("s3", endpoint_url=endpoint)
            body = self.client.get_object(Bucket="b", Key="train/" + keys[i])["Body"].read()
            from asyncloader import RandomResizedCrop
            from asyncloader._decode import DecodeSpec, decode_into

            out = np.empty((3, 224, 224), np.uint8)
            spec = DecodeSpec((3, 224, 224), RandomResizedCrop(224), roi=False)  # whole image
            decode_into(body, out, spec, i, keys[i])
            return torch.from_numpy(out), 0

    loader = DataLoader(Boto3Images(), batch_size=batch, shuffle=True, num_workers=4)
    t0, c0 = time.perf_counter(), _cpu()
    n = sum(len(x) for x, _ in loader)
    wall = time.perf_counter() - t0
    return {"images": n, "wall": wall, "cpu": _cpu() - c0}


def case_asyncloader(
    endpoint: str, batch: int, workers: int, epochs: int = 1, backend: str = "thread"
) -> dict[str, float]:
    import asyncloader as al

    mode = "inline" if backend == "inline" else "process"
    start = time.perf_counter()
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        transform=al.RandomResizedCrop(224),
        engine=al.EngineConfig(mode=mode),
        decode=al.DecodeConfig(workers=workers),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        first = 0.0
        for batch in loader:  # epoch 0: start-up, connections
            del batch  # none kept: each slot goes back at once
            first = first or time.perf_counter() - start
        t0, c0 = time.perf_counter(), _cpu()
        n = sum(len(x) for _ in range(epochs) for x, _ in loader)
        wall = time.perf_counter() - t0
        bound = loader.stats().bound
    out = {"images": n, "wall": wall, "cpu": _cpu() - c0, "bound": bound, "first": first}
    return out  # type: ignore[return-value]


def write_json(path: str, args: dict[str, object], rows: dict[str, list[dict[str, float]]]) -> None:
    """Every round of every case, their medians (images/s, CPU ms per image, peak RSS), and
    where they were made: the command, the date, the commit, the machine."""
    import platform

    def med(xs: list[float]) -> float:
        return float(np.median(xs)) if xs else float("nan")

    def git(*argv: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True)
        return out.stdout

    # The code measured: the package and the benchmarks (docs may change beside them).
    changed = git("status", "--porcelain", "-uno", "--", "asyncloader", "benchmarks").strip()
    commit = git("rev-parse", "--short", "HEAD").strip() + ("-modified" if changed else "")
    out = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}",
        "args": {k: v for k, v in args.items() if k not in ("case", "json", "node_member")},
        "medians": {
            name: {
                "images_per_second": med([r["images"] / r["wall"] for r in rs]),
                # (None for a case whose processes are not measured: bench_tail's node cases)
                "cpu_ms_per_image": (
                    med([r["cpu"] / r["images"] * 1e3 for r in rs])
                    if all("cpu" in r for r in rs)
                    else None
                ),
                "peak_rss_mb": max((r.get("rss_mb", 0.0) for r in rs), default=0.0),
            }
            for name, rs in rows.items()
        },
        "rounds": rows,
    }
    Path(path).write_text(json.dumps(out, indent=1))


def run_case(argv: list[str], script: str = __file__) -> dict[str, float]:
    """Run ``script --case ARGV`` in a fresh process; its last stdout line is JSON."""
    out = subprocess.run(
        [sys.executable, script, "--case", *argv], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--latencies", default="0,0.02,0.05", help="seconds, comma-separated")
    p.add_argument("--data-dir", default=str(ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--skip-dataloader", action="store_true")
    p.add_argument(
        "--inline", action="store_true", help="also asyncloader with its engine in-process"
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds of all cases")
    p.add_argument("--epochs", type=int, default=2, help="passes measured per case")
    p.add_argument("--json", metavar="PATH", help="also write every round and the medians here")
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    folder = Path(args.data_dir)
    if args.case:
        kind, *rest = args.case
        if kind == "ceiling":
            res = case_ceiling(folder, args.workers, rest[0], args.epochs)
        elif kind == "dataloader":
            res = case_dataloader(folder, rest[0], args.batch_size)
        else:
            res = case_asyncloader(rest[0], args.batch_size, args.workers, args.epochs, *rest[1:])
        res["rss_mb"] = _peak_rss_mb()
        print(json.dumps(res))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    make_jpeg_folder(folder, images=args.images, classes=10, seed=0)
    common = ["--data-dir", str(folder), "--workers", str(args.workers)]
    common += ["--batch-size", str(args.batch_size), "--epochs", str(args.epochs)]
    lats = [float(x) for x in args.latencies.split(",")]
    # Rounds: every case once per round, so a slow spell of this shared machine hits all
    # cases of a round alike; each round's ratios are to that round's ceiling.
    rounds: list[dict[str, dict[str, float]]] = []
    for _ in range(args.repeat):
        rows: dict[str, dict[str, float]] = {}
        for kind in ("thread", "process"):
            rows[f"ceiling ({kind} pool, RAM)"] = run_case(["ceiling", kind, *common])
        for lat in lats:
            with S3TestServer(latency=lat, load=folder, bucket="b", prefix="train/") as srv:
                if not args.skip_dataloader:
                    rows[f"DataLoader+boto3 @{lat * 1e3:.0f} ms"] = run_case(
                        ["dataloader", srv.endpoint, *common]
                    )
                rows[f"asyncloader @{lat * 1e3:.0f} ms"] = run_case(
                    ["asyncloader", srv.endpoint, *common]
                )
                if args.inline:
                    rows[f"asyncloader inline @{lat * 1e3:.0f} ms"] = run_case(
                        ["asyncloader", srv.endpoint, "inline", *common]
                    )
        rounds.append(rows)
    kb = np.mean([f.stat().st_size for f in _files(folder)]) / 1e3
    print(
        f"\n{args.images} JPEGs (~{kb:.0f} KB), {args.workers} workers, "
        f"batch {args.batch_size}, {os.cpu_count()} cores, {args.repeat} round(s); "
        "median over rounds, each ratio to its own round's ceiling\n"
    )
    print(
        f"{'case':34s} {'img/s':>7s} {'x ceil':>7s} {'CPU ms/img':>10s} {'x ceil':>7s} "
        f"{'peak RSS MB':>11s} {'first s':>7s}  x ceil per round"
    )
    ratios: dict[str, list[float]] = {}
    for name in rounds[0]:
        ips, xc, cpu, xcpu, rss, first = [], [], [], [], [], []
        for rows in rounds:
            ceiling = max(
                (r for n, r in rows.items() if n.startswith("ceiling")),
                key=lambda r: r["images"] / r["wall"],
            )
            r = rows[name]
            ips.append(r["images"] / r["wall"])
            xc.append(ips[-1] / (ceiling["images"] / ceiling["wall"]))
            cpu.append(r["cpu"] / r["images"])
            xcpu.append(cpu[-1] / (ceiling["cpu"] / ceiling["images"]))
            rss.append(r["rss_mb"])
            first.append(r.get("first", float("nan")))
        ratios[name] = ips
        med = np.median
        print(
            f"{name:34s} {med(ips):7.0f} {med(xc):7.2f} {med(cpu) * 1e3:10.2f} {med(xcpu):7.2f} "
            f"{max(rss):11.0f} {med(first):7.2f}  {' '.join(f'{x:.2f}' for x in xc)}"
        )
    if args.json:
        by_case = {name: [rows[name] for rows in rounds] for name in rounds[0]}
        write_json(args.json, vars(args), by_case)
    for lat in lats:
        a = ratios.get(f"asyncloader @{lat * 1e3:.0f} ms")
        for other in ("DataLoader+boto3", "asyncloader inline"):
            d = ratios.get(f"{other} @{lat * 1e3:.0f} ms")
            if a and d:
                per = [x / y for x, y in zip(a, d, strict=True)]
                print(
                    f"asyncloader / {other} @{lat * 1e3:.0f} ms: {np.median(per):.2f}x "
                    f"(per round: {' '.join(f'{x:.2f}' for x in per)})"
                )


if __name__ == "__main__":
    main()
