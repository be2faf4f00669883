"""How much a loader slows the training step beside it: the trainer pinned to one core, every
thread of every child process pinned to the others, a GIL-bound training step.

The training process (a fresh process per case) runs on CPU 0 only; the benchmark's own
process, on the other CPUs, pins every thread of every process below the trainer (engine
processes, DataLoader workers) to the other CPUs, again every 0.2 s as threads come and go
(so nothing of the measurement runs in the trainer), and the S3 server runs there too.
The step is pure Python, calibrated alone to ``--step-ms`` (20 ms): what a Python-heavy
training loop (augmentation in Python, logging, a host-side scheduler) spends holding the
GIL.  Each case takes batches as fast as the step
allows for ``--images`` images; printed per case, medians over ``--repeat`` interleaved
rounds: the step's time beside the loader over its time alone (median and p90 of the
steps) and over its time beside a busy neighbour (``burn``), images/s, and the CPU per image
that the loader costs the training process (its CPU time less the steps').

Cases:

* ``alone`` — the step without a loader: the baseline, measured the same way;
* ``burn`` — no loader, and a child process that spins in pure Python on the other CPUs:
  what any busy neighbour costs the step on this machine (shared caches, memory, a
  hypervisor's scheduling), the floor no loader can go under;
* ``default`` — ``ImageLoader`` as it comes: the engine in a process of its own (fetch,
  cache fill, decode), the trainer mapping its ring and giving slots back;
* ``inline`` — ``ImageLoader(engine=EngineConfig(mode="inline"))``: the engine on an
  event-loop thread of the training process, decode threads there too (the named
  in-process mode; what every loader did before engine processes);
* ``dataloader`` — ``asyncloader.torch.ImageDataset`` in a 1-worker ``DataLoader``: the
  whole loader in the worker process.

Storage is our light S3 server with ``--latency`` to the first byte.
Run: ``python benchmarks/bench_neighbour.py [--images 2000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = ("alone", "burn", "default", "inline", "dataloader")
_SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


class Pinner:
    """Pins every thread of every process below ``root`` (not ``root`` itself) to ``cpus``,
    every ``every`` seconds."""

    def __init__(self, root: int, cpus: set[int], every: float = 0.2) -> None:
        self._root, self._cpus, self._every = root, cpus, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pinner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.pin_now()

    def pin_now(self) -> None:
        from asyncloader.testing import descendants

        for pid in descendants(self._root):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                with contextlib.suppress(OSError):  # gone meanwhile
                    os.sched_setaffinity(int(tid), self._cpus)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _work(n: int) -> int:
    """The pure-Python training step: holds the GIL throughout."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def calibrate(step_ms: float) -> int:
    """Iterations of :func:`_work` that take ``step_ms`` alone on this core (the median of
    5 timings, after a warm-up)."""
    n = 10_000
    while True:
        t0 = time.perf_counter()
        _work(n)
        if time.perf_counter() - t0 > 0.05:
            break
        n *= 2
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        _work(n)
        took.append(time.perf_counter() - t0)
    return int(n * step_ms / 1e3 / statistics.median(took))


def _thread_cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def run_case(case: str, endpoint: str, images: int, batch: int, n: int) -> dict[str, Any]:
    """One case in this (fresh, pinned) process."""
    import torch

    import asyncloader as al
    from asyncloader.torch import ImageDataset

    common: dict[str, Any] = {
        "batch_size": batch,
        "transform": al.RandomResizedCrop(224),
        "store": al.StoreConfig(options={"endpoint_url": endpoint}),
        # The cores besides the trainer's.
        "decode": al.DecodeConfig(workers=max(1, (os.cpu_count() or 2) - 1)),
    }
    steps: list[float] = []
    step_cpu = 0.0
    got = 0
    if case in ("alone", "burn"):
        count = max(images // batch, 20)
        spin = None
        if case == "burn":  # pinned to the other CPUs by the benchmark's process
            code = _SPIN.format(seconds=count * n / 1e6 + 30)
            spin = subprocess.Popen([sys.executable, "-c", code])
            time.sleep(0.5)
        try:
            for _ in range(count):
                s0 = time.perf_counter()
                _work(n)
                steps.append(time.perf_counter() - s0)
        finally:
            if spin is not None:
                spin.kill()
                spin.wait()
        return {"case": case, "images": 0, "wall": 1.0, "steps": steps}
    if case == "dataloader":
        ds = ImageDataset("s3://b/train/", **common)
        source: Any = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    elif case == "default":
        source = al.ImageLoader("s3://b/train/", **common)
    else:
        source = al.ImageLoader("s3://b/train/", engine=al.EngineConfig(mode="inline"), **common)
    try:
        it = iter(source)
        first = next(it)  # start-up is not measured
        del first
        time.sleep(0.5)  # the benchmark's process pins the new threads meanwhile
        t0, c0 = time.perf_counter(), time.process_time()
        while got < images:
            try:
                images_, _labels = next(it)
            except StopIteration:
                it = iter(source)
                continue
            got += len(images_)
            del images_, _labels
            s0, sc0 = time.perf_counter(), _thread_cpu()
            _work(n)
            steps.append(time.perf_counter() - s0)
            step_cpu += _thread_cpu() - sc0
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    # The training process's CPU, the step's own taken out: what the loader costs it.
    return {
        "case": case,
        "images": got,
        "wall": wall,
        "steps": steps,
        "loader_cpu_ms_per_image": max(cpu - step_cpu, 0.0) / got * 1e3,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000, help="images per case")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--data-dir", default=str(HERE.parent / "cache" / "bench-jpegs"))
    p.add_argument("--json", metavar="PATH", help="also write every round here")
    p.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    cpus = set(range(os.cpu_count() or 1))
    if len(cpus) < 2:
        raise SystemExit("bench_neighbour.py needs at least 2 CPUs")
    if args.case:
        os.sched_setaffinity(0, {0})  # the trainer's core; threads made here inherit it
        case, endpoint, images, n = args.case
        res = run_case(case, endpoint, int(images), args.batch_size, int(n))
        print(json.dumps(res))
        return
    others = cpus - {0}
    for tid in os.listdir("/proc/self/task"):  # this process and the server: not the trainer's
        os.sched_setaffinity(int(tid), others)

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = Path(args.data_dir)
    make_jpeg_folder(folder, images=1500, classes=10, seed=0)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import os, sys; sys.path.insert(0, {str(HERE)!r}); "
            f"os.sched_setaffinity(0, {{0}}); import bench_neighbour as b; "
            f"print(b.calibrate({args.step_ms}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    n = int(probe.stdout.split()[-1])  # calibrated on the trainer's core
    names = [c for c in args.cases.split(",") if c]
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    with S3TestServer(latency=args.latency, load=folder, bucket="b", prefix="train/") as srv:
        for r in range(args.repeat):
            for case in names if r % 2 == 0 else names[::-1]:
                argv = [sys.executable, __file__, "--case", case, srv.endpoint]
                argv += [str(args.images), str(n), "--batch-size", str(args.batch_size)]
                proc = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
                pinner = Pinner(proc.pid, others)
                try:
                    out, err = proc.communicate()
                finally:
                    pinner.close()
                if proc.returncode:
                    raise RuntimeError(err[-4000:])
                rows[case].append(json.loads(out.strip().splitlines()[-1]))
    med = statistics.median
    alone = [x for r in rows.get("alone", []) for x in r["steps"]]
    if not alone:
        raise SystemExit("the alone case is the baseline: keep it in --cases")
    base = med(alone)
    burn = [x for r in rows.get("burn", []) for x in r["steps"]]
    floor = med(burn) if burn else float("nan")
    print(
        f"\nstep alone: median {base * 1e3:.1f} ms ({len(alone)} steps); "
        f"{args.latency * 1e3:.0f} ms to first byte, batch {args.batch_size}, "
        f"{args.images} images per case, {args.repeat} rounds; medians over rounds\n"
    )
    print(
        f"{'case':12s} {'step x alone':>12s} {'p90 x alone':>11s} {'x burn':>7s} {'img/s':>7s} "
        f"{'trainer CPU ms/img':>18s}"
    )
    for case in names:
        rs = rows[case]
        if case == "alone":
            continue
        if case == "burn":
            infl = med([med(x["steps"]) / base for x in rs])
            p90 = med([statistics.quantiles(x["steps"], n=10)[-1] / base for x in rs])
            print(f"{case:12s} {infl:12.2f} {p90:11.2f} {1.0:7.2f} {'-':>7s} {'-':>18s}")
            continue
        infl = med([med(x["steps"]) / base for x in rs])
        p90 = med([statistics.quantiles(x["steps"], n=10)[-1] / base for x in rs])
        ips = med([x["images"] / x["wall"] for x in rs])
        cpu = med([x["loader_cpu_ms_per_image"] for x in rs])
        over = med([med(x["steps"]) / floor for x in rs])
        print(f"{case:12s} {infl:12.2f} {p90:11.2f} {over:7.2f} {ips:7.0f} {cpu:18.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"alone": alone, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
