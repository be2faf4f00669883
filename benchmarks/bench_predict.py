"""``asyncloader bench`` against a measured loader run, on the same server, in one run.

For each latency (our light S3 server, a subprocess, with that time to first byte), run
``asyncloader bench URL --json`` (a subprocess: what a user runs), then the loader with the
settings it printed (a subprocess too), and compare the predicted images/s with the
loader's steady rate (the epochs after the first).  The ratio is the result; CPU per image
and peak memory of the loader are printed beside it.

Run: ``python benchmarks/bench_predict.py [--latencies 0.02,0.05] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_loader import _cpu, _peak_rss_mb  # noqa: E402


def case_loader(endpoint: str, settings: dict[str, object], epochs: int) -> dict[str, float]:
    import asyncloader as al

    with al.ImageLoader(
        "s3://b/train/",
        batch_size=128,
        fetch=al.FetchConfig(max_inflight=int(settings["max_inflight"])),  # type: ignore[call-overload]
        decode=al.DecodeConfig(workers=int(settings["decode_workers"])),  # type: ignore[call-overload]
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        for batch in loader:  # epoch 0: start-up, connections
            del batch  # none kept: each slot goes back at once
        t0, c0 = time.perf_counter(), _cpu()
        n = sum(len(x) for _ in range(epochs) for x, _ in loader)
        wall = time.perf_counter() - t0
    return {"images": n, "wall": wall, "cpu": _cpu() - c0, "rss_mb": _peak_rss_mb()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--latencies", default="0.02,0.05", help="seconds, comma-separated")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--seconds", type=float, default=30.0, help="the bench's time budget")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--max-inflight",
        type=int,
        default=256,
        help="the bench's most requests in flight: small values make the run fetch-bound",
    )
    p.add_argument("--data-dir", default=str(ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--case", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        endpoint, settings, epochs = args.case
        print(json.dumps(case_loader(endpoint, json.loads(settings), int(epochs))))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = Path(args.data_dir)
    make_jpeg_folder(folder, images=args.images, classes=10, seed=0)
    rows: dict[float, list[tuple[float, dict[str, float], dict[str, object]]]] = {}
    for _ in range(args.repeat):
        for lat in (float(x) for x in args.latencies.split(",")):
            with (
                S3TestServer(latency=lat, load=folder, bucket="b", prefix="train/") as srv,
                tempfile.TemporaryDirectory() as tmp,
            ):
                env = {**os.environ, "AWS_ENDPOINT_URL": srv.endpoint}
                cmd = [sys.executable, "-m", "asyncloader", "bench", "s3://b/train/", "--json"]
                cmd += ["--seconds", str(args.seconds), "--cache-dir", tmp]
                out = subprocess.run(
                    [*cmd, "--max-inflight", str(args.max_inflight)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                report = json.loads(out.stdout)
                settings = json.dumps(report["settings"])
                run = subprocess.run(
                    [sys.executable, __file__, "--case", srv.endpoint, settings, str(args.epochs)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                measured = json.loads(run.stdout.strip().splitlines()[-1])
                rows.setdefault(lat, []).append(
                    (report["predicted_images_per_second"], measured, report)
                )
    print(f"\n{args.images} JPEGs, {os.cpu_count()} cores, {args.repeat} round(s), medians\n")
    print(
        f"{'latency':>8} {'predicted':>9} {'measured':>9} {'pred/meas':>9} {'bound':>7} "
        f"{'inflight':>8} {'CPU ms/img':>10} {'peak RSS MB':>11}  per round"
    )
    for lat, got in rows.items():
        ratios = [pred / (m["images"] / m["wall"]) for pred, m, _ in got]
        last = got[-1][2]
        print(
            f"{lat * 1e3:6.0f}ms {statistics.median(g[0] for g in got):9.0f} "
            f"{statistics.median(m['images'] / m['wall'] for _, m, _ in got):9.0f} "
            f"{statistics.median(ratios):9.2f} {last['bound']!s:>7} "
            f"{last['settings']['max_inflight']!s:>8} "  # type: ignore[index]
            f"{statistics.median(m['cpu'] / m['images'] for _, m, _ in got) * 1e3:10.2f} "
            f"{max(m['rss_mb'] for _, m, _ in got):11.0f}  " + " ".join(f"{r:.2f}" for r in ratios)
        )


if __name__ == "__main__":
    main()
