"""Where one loader stops scaling: images/s, the training process's CPU per image, and the CPU
per image of the busiest thread anywhere (the training process and every process below it),
with a trivial decode hook (what the coordination costs alone) and with the real decode.

The busiest thread's CPU per image bounds the loader: no number of cores makes it go past
``1 / that`` images/s, the serial bound printed.  With a trivial decode, the busiest thread
is the coordination (an engine's event loop, a decode-send thread).  With the engine in
processes, each engine's loop sees only its share of the images, so the bound rises with
the engine count (``--engines``); the training process keeps only the batch hand-over.

A case is ``ENGINES:BACKEND:DECODE``: ``inline`` (the engine in the training process) or a
number of engine processes; the decode backend, ``thread`` (``process``, decode processes
below an engine, was measured against engines of one thread each, then removed:
``benchmarks/RESULTS.md``, "One kind of worker process"); ``trivial`` (a
hook that costs nothing: what the coordination costs alone), ``real`` (JPEG decode and
RandomResizedCrop(224)) or ``gil`` (a ``decode=`` hook that holds the GIL most of its time:
Pillow's decode and resize to 64 px, then a pure-Python pass over its pixels, as hooks
written in Python do; the case decode processes exist for).  Besides the trainer's CPU per
image, "all CPU" is the CPU per image of every process of the loader (``tree_cpu_seconds``),
and "peak MB" the most memory the loader's processes held together while measured: the sum
of their proportional set sizes (PSS, ``/proc/PID/smaps_rollup``: a page shared by k
processes, a ring say, counts 1/k in each), sampled every 100 ms (on a thread of the
trainer: its CPU is in the trainer's figure, the same in every case).
Each case runs in a fresh process: a warm-up epoch, then ``--epochs`` measured; thread
CPU times are read from ``/proc`` (Linux) before and after.  Storage is our light S3 server
with ``--latency`` to the first byte.

Run: ``python benchmarks/bench_scale.py [--images 1500] [--latency 0.02] [--engines inline,1,2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_loader as bl  # noqa: E402  (its run_case: a case in a fresh process)

DECODES = ("trivial", "real", "gil")
_TICK = os.sysconf("SC_CLK_TCK")


def trivial(data: bytes) -> np.ndarray[Any, Any]:
    """A decode hook that costs almost nothing: a byte of the object, broadcast."""
    return np.full((3, 8, 8), data[len(data) // 2], np.uint8)


def gil_bound(data: bytes) -> np.ndarray[Any, Any]:
    """A decode hook that holds the GIL most of its time (see the module's docstring)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (128, 128))
        small = im.convert("RGB").resize((64, 64))
    pixels = small.tobytes()
    out = bytearray(len(pixels))
    for i in range(0, len(pixels), 3):  # a channel swap in Python: GIL held throughout
        out[i], out[i + 1], out[i + 2] = pixels[i + 2], pixels[i + 1], pixels[i]
    return np.frombuffer(bytes(out), np.uint8).reshape(64, 64, 3).transpose(2, 0, 1)


def _threads(pids: list[int]) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds of every thread of ``pids``, by (pid, tid), with the thread's name."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    head, rest = f.read().rsplit(")", 1)
                fields = rest.split()
                cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
                out[(pid, int(tid))] = (head.split("(", 1)[1], cpu)
            except (OSError, IndexError, ValueError):
                continue
    return out


def _pss_bytes(pid: int) -> int:
    """Proportional set size of process ``pid`` [bytes]; 0 where it or ``/proc`` is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


class _PeakMemory:
    """The most memory the processes ``pids`` held together (the sum of their PSS), sampled
    on a thread every ``every`` seconds while running."""

    def __init__(self, pids: list[int], every: float = 0.1) -> None:
        self._pids = pids
        self._every = every
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            total = sum(_pss_bytes(pid) for pid in self._pids)
            self.peak = max(self.peak, total)
            if self._stop.wait(self._every):
                return

    def stop(self) -> int:
        """Stop sampling; the peak [bytes]."""
        self._stop.set()
        self._thread.join()
        return self.peak


def _kind(pid: int) -> str:
    """What a process below the trainer is, by its command line."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "a process"
    if b"engine_main" in cmd:
        return "a thread of an engine process"
    return "a decode process" if b"worker_main" in cmd else "a process"


def run_case(case: str, endpoint: str, batch: int, workers: int, epochs: int) -> dict[str, Any]:
    import asyncloader as al

    engines, backend, decode = case.split(":")
    engine = (
        al.EngineConfig(mode="inline")
        if engines == "inline"
        else al.EngineConfig(processes=int(engines))
    )
    if backend != "thread":  # "process" (decode processes below an engine) is gone
        raise SystemExit(f"{case}: the decode backend is 'thread' (engines of threads)")
    transform = None
    if decode == "trivial":
        decoding = al.DecodeConfig(workers=workers, hook=trivial, sample_shape=(3, 8, 8))
    elif decode == "gil":
        decoding = al.DecodeConfig(workers=workers, hook=gil_bound, sample_shape=(3, 64, 64))
    else:
        decoding = al.DecodeConfig(workers=workers)
        transform = al.RandomResizedCrop(224)
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=batch,
        transform=transform,
        engine=engine,
        decode=decoding,
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        for batch in loader:  # warm-up epoch: start-up, connections
            del batch  # none kept: each slot goes back at once
        from asyncloader.testing import descendants, tree_cpu_seconds

        # Found once, so that each reading is a few files (the loader runs on meanwhile).
        pids = [os.getpid(), *descendants(os.getpid())]
        kinds = {pid: _kind(pid) for pid in pids}
        before, c0, t0 = _threads(pids), time.process_time(), time.perf_counter()
        tree0 = tree_cpu_seconds()
        memory = _PeakMemory(pids)
        n = sum(len(labels) for _ in range(epochs) for _, labels in loader)
        peak = memory.stop()
        wall, cpu, after = time.perf_counter() - t0, time.process_time() - c0, _threads(pids)
        tree = tree_cpu_seconds() - tree0
        # The trainer's threads by their Python names (the OS knows them all as "python").
        named = {t.native_id: t.name for t in threading.enumerate()}
    me = os.getpid()
    busiest = max(
        (
            (
                after[k][1] - before.get(k, ("", 0.0))[1],
                named.get(k[1], after[k][0]) if k[0] == me else kinds[k[0]],
                k[0] == me,
            )
            for k in after
        ),
        default=(0.0, "", True),
    )
    return {
        "case": case,
        "images": n,
        "wall": wall,
        "trainer_cpu_ms": cpu / n * 1e3,
        "tree_cpu_ms": tree / n * 1e3,
        "busiest_ms": busiest[0] / n * 1e3,
        "peak_mb": peak / 1e6,
        "busiest_name": busiest[1],
        "busiest_in_trainer": busiest[2],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--engines", default="inline,1,2", help="inline and/or process counts")
    p.add_argument("--backend", default="thread", help="decode backend of every case")
    p.add_argument("--cases", default="", help="ENGINES:BACKEND:DECODE, comma-separated")
    p.add_argument("--data-dir", default=str(HERE.parent / "cache" / "bench-jpegs"))
    p.add_argument("--json", metavar="PATH", help="also write every round here")
    p.add_argument(
        "--paired",
        default="",
        help="B/A,... : for each pair of cases, the median of the rounds' own ratios",
    )
    p.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        res = run_case(args.case[0], args.case[1], args.batch_size, args.workers, args.epochs)
        print(json.dumps(res))
        return

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = Path(args.data_dir)
    make_jpeg_folder(folder, images=args.images, classes=10, seed=0)
    names = [c for c in args.cases.split(",") if c] or [
        f"{e}:{args.backend}:{d}" for d in DECODES for e in args.engines.split(",")
    ]
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    common = ["--batch-size", str(args.batch_size), "--workers", str(args.workers)]
    common += ["--epochs", str(args.epochs)]
    with S3TestServer(latency=args.latency, load=folder, bucket="b", prefix="train/") as srv:
        for r in range(args.repeat):
            for case in names if r % 2 == 0 else names[::-1]:
                rows[case].append(bl.run_case([case, srv.endpoint, *common], script=__file__))
                print(case, json.dumps(rows[case][-1]), flush=True)  # progress, if cut short
    med = np.median
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows}, indent=1))
    print(
        f"\n{args.images} JPEGs, {args.workers} decode workers, batch {args.batch_size}, "
        f"{os.cpu_count()} cores, {args.latency * 1e3:.0f} ms, {args.repeat} rounds; medians\n"
    )
    print(
        f"{'case':20s} {'img/s':>7s} {'trainer CPU ms/img':>18s} {'all CPU ms/img':>14s} "
        f"{'busiest thread ms/img':>21s} {'serial bound img/s':>18s} {'peak MB':>8s}  "
        "busiest thread"
    )
    for case in names:
        rs = rows[case]
        busiest = med([x["busiest_ms"] for x in rs])
        last = rs[-1]
        where = "trainer" if last["busiest_in_trainer"] else "child"
        print(
            f"{case:20s} {med([x['images'] / x['wall'] for x in rs]):7.0f} "
            f"{med([x['trainer_cpu_ms'] for x in rs]):18.3f} "
            f"{med([x['tree_cpu_ms'] for x in rs]):14.3f} {busiest:21.3f} "
            f"{1e3 / busiest if busiest else float('inf'):18.0f} "
            f"{med([x.get('peak_mb', 0.0) for x in rs]):8.0f}  "
            f"{last['busiest_name']} ({where})"
        )
    for pair in [x for x in args.paired.split(",") if x]:
        b, a = pair.split("/")

        def paired(key: Any, b: str = b, a: str = a) -> float:
            return float(med([key(y) / key(x) for x, y in zip(rows[a], rows[b], strict=True)]))

        print(
            f"{b} / {a}, median of the {args.repeat} rounds' ratios: images/s "
            f"{paired(lambda x: x['images'] / x['wall']):.2f}, all CPU per image "
            f"{paired(lambda x: x['tree_cpu_ms']):.2f}, peak memory "
            f"{paired(lambda x: x.get('peak_mb', 0.0) or 1.0):.2f}"
        )


if __name__ == "__main__":
    main()
