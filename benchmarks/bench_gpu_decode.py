"""GPU JPEG decode (``DecodeConfig(backend="cuda")``) against CPU decode, delivered into one GPU.

In one run, each case in a fresh process pinned to its cores (``os.sched_setaffinity``),
from a warm SSD cache (warmed first, by a loader of its own), RandomResizedCrop(224),
float16 batches on the GPU:

* ``gpu-N``   — ``DecodeConfig(backend="cuda")`` on N cores, for each N of ``--cores``
  (``4,8`` by default): the default engine processes ship each batch's JPEGs and crop
  plans, the training process decodes them on the GPU;
* ``gpu-inline-N`` — the same with ``EngineConfig(mode="inline")``: the engine's per-sample
  work on threads of the training process;
* ``cpu-N``   — CPU decode (``DecodeConfig(backend="thread")``) on the same cores;
* ``cpu-all`` — CPU decode on every core.

Each case's CPU per image is given twice: the whole process tree's, and the training
process's own (its every thread: the consumer, the uploader, the GPU's batches).  For the
GPU cases, the training process's CPU is also split by part of a batch's GPU work (each
part's own thread's CPU time, summed; nested): ``unpack`` (the shipped batch, in all),
``run`` (``GpuBatcher.run``), and within it ``stage`` (the bytes into one pinned buffer),
``nvjpeg`` (torchvision's call), ``check``, ``resize`` and ``hardware`` (nvJPEG asked
which JPEGs its hardware decoder takes).

Rounds are interleaved (``--rounds``) and medians quoted.  Then, on the GPU alone:

* ``raw``    — the decoders by themselves on the folder's bytes, batches of ``--batch-size``:
  torchvision's batched nvJPEG ``decode_jpeg(device="cuda")`` and, where it is installed,
  nvImageCodec (``nvidia-nvimgcodec-cu13``); images/s and CPU ms per image;
* ``pixels`` — two epochs in batches of 16 through the GPU path (engine processes) and the
  CPU path with the same seed: the per-image mean absolute difference (median, p99, max),
  the largest pixel difference, and the batches with an image past the stated tolerance
  (a mean absolute difference over 5 levels) or other labels.

``--dry``: on a machine without CUDA (the script's own check, ``gpu_check.sh --dry``): the
same cases at the size given, batches on the CPU, the GPU's part played by a whole-image
Pillow decoder in nvJPEG's place (as the CPU tests do), no ``raw`` case.  Its figures mean
nothing; that every case runs and the table prints is what it shows.

Run: ``python benchmarks/bench_gpu_decode.py [--images 4000] [--cores 4,8] [--dry]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_loader as bl


def _loader(
    endpoint: str, cache: str, backend: str, workers: int, mode: str = "process", **kw: Any
) -> Any:
    import asyncloader as al

    return al.ImageLoader(
        "s3://b/train/",
        batch_size=kw.pop("batch_size", 256),
        cache_dir=cache,
        **kw,
        decode=al.DecodeConfig(backend=backend, workers=workers),
        engine=al.EngineConfig(mode=mode),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    )


DEVICE = "cuda"  # "cpu" under --dry


def _dry() -> None:
    """--dry: GPU decode's GPU part played on the CPU (no CUDA check; a whole-image Pillow
    decoder in nvJPEG's place), batches on the CPU."""
    global DEVICE
    import io

    import numpy as np
    import torch
    from PIL import Image

    import asyncloader._decode._gpu_batch as gpu_batch
    import asyncloader._run._build as build

    def pillow(data: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
        out: list[torch.Tensor | BaseException] = []
        for one in data:
            img = Image.open(io.BytesIO(one.numpy().tobytes())).convert("RGB")
            out.append(torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()))
        return out

    build._check_gpu_decode = lambda *a, **k: None  # type: ignore[attr-defined]
    gpu_batch.nvjpeg_batch = lambda device: pillow  # type: ignore[assignment]
    DEVICE = "cpu"


def _time_phases() -> dict[str, float]:
    """Wrap the parts of GPU decode's batch so that each adds its thread's CPU time to the
    dict returned [seconds] (in this process; see the module's docstring)."""
    import asyncloader._decode._gpu_batch as gb
    import asyncloader._decode._nvjpeg as nj

    spent: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - t0

        return run

    make_decoder = gb.nvjpeg_batch  # (--dry: the Pillow stand-in's)
    gb.nvjpeg_batch = lambda device: timed("nvjpeg", make_decoder(device))  # type: ignore[assignment]
    gb.ShipUnpacker.__call__ = timed("unpack", gb.ShipUnpacker.__call__)  # type: ignore[method-assign]
    for part, method in (("run", "run"), ("stage", "stage")):
        setattr(gb.GpuBatcher, method, timed(part, getattr(gb.GpuBatcher, method)))
    gb.GpuBatcher._suspects = timed("check", gb.GpuBatcher._suspects)  # type: ignore[method-assign]
    gb.GpuBatcher._resize = timed("resize", gb.GpuBatcher._resize)  # type: ignore[method-assign]
    nj.NvjpegProbe.takes = timed("hardware", nj.NvjpegProbe.takes)  # type: ignore[method-assign]
    return spent


def _synchronize() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def case_loader(
    endpoint: str, cache: str, backend: str, cores: list[int], batch: int, epochs: int, mode: str
) -> dict[str, float]:
    import torch

    os.sched_setaffinity(0, cores)
    # torch sized its CPU thread pool by the cores it saw when imported (all of them):
    # as many threads as the cores this case holds, or they take turns on them.
    torch.set_num_threads(len(cores))
    spent = _time_phases() if backend == "cuda" else {}
    with _loader(
        endpoint,
        cache,
        backend,
        len(cores),
        mode,
        batch_size=batch,
        device=DEVICE,
        dtype="float16",
    ) as loader:
        next(iter(loader))  # start-up out of the figures
        _synchronize()
        spent.clear()
        n = 0
        t0, c0, s0 = time.perf_counter(), bl._cpu(), time.process_time()
        for epoch in range(1, epochs + 1):
            loader.set_epoch(epoch)
            for images, _ in loader:
                n += len(images)
        _synchronize()
        res = {
            "images": n,
            "wall": time.perf_counter() - t0,
            "cpu": bl._cpu() - c0,
            "trainer_cpu": time.process_time() - s0,
        }
        pool = getattr(getattr(loader._engine, "rt", None), "pool", None)  # in-process
        stats = loader.stats()
        res["on_cpu"] = stats.gpu_to_cpu + stats.gpu_suspect
        res["suspect"] = stats.gpu_suspect
        res["on_gpu"] = stats.gpu_decoded
        res["hardware"] = stats.gpu_hardware
        res["engines"] = -1 if stats.gpu_engines is None else stats.gpu_engines
        res["decode_calls"] = getattr(pool, "batches", 0)
        res["hits"] = stats.cache_hits
        for part, seconds in spent.items():
            res[f"trainer {part} ms/img"] = seconds / max(n, 1) * 1e3
        return res


def case_warm(endpoint: str, cache: str) -> dict[str, float]:
    with _loader(endpoint, cache, "thread", os.cpu_count() or 2) as loader:
        n = sum(len(images) for images, _ in loader)
    return {"images": n}


def case_raw(folder: str, batch: int) -> dict[str, float]:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [p.read_bytes() for p in bl._files(Path(folder))]
    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    out: dict[str, float] = {}

    def timed(name: str, run: Any) -> None:
        for rep in range(2):  # the first round warms up the decoder
            torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), bl._cpu()
            for i in range(0, len(data), batch):
                run(i)
            torch.cuda.synchronize()
            if rep:
                wall, cpu = time.perf_counter() - t0, bl._cpu() - c0
                out[f"{name} img/s"] = len(data) / wall
                out[f"{name} CPU ms/img"] = cpu / len(data) * 1e3

    timed(
        "torchvision",
        lambda i: decode_jpeg(tensors[i : i + batch], mode=ImageReadMode.RGB, device="cuda"),
    )
    try:
        from nvidia import nvimgcodec  # type: ignore[import-not-found]
    except ImportError as exc:
        out["nvimgcodec"] = f"not installed: {exc}"  # type: ignore[assignment]
        return out
    dec = nvimgcodec.Decoder()
    timed("nvimgcodec", lambda i: dec.decode(data[i : i + batch]))
    return out


def case_pixels(endpoint: str, cache: str) -> dict[str, float]:
    import numpy as np
    import torch

    got: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for backend in ("cuda", "thread"):
        with _loader(
            endpoint,
            cache,
            backend,
            os.cpu_count() or 2,
            batch_size=16,
            seed=11,
            device=DEVICE,
            dtype="uint8",
        ) as loader:
            got[backend] = []
            for epoch in range(1 if DEVICE == "cpu" else 2):  # --dry: one
                loader.set_epoch(epoch)
                got[backend] += [(images.cpu(), labels.cpu()) for images, labels in loader]
    means, tops, wrong = [], [], 0
    for (a, la), (b, lb) in zip(got["cuda"], got["thread"], strict=True):
        d = (a.float() - b.float()).abs()
        per_image = d.mean(dim=(1, 2, 3)).tolist()
        means += per_image
        tops += d.amax(dim=(1, 2, 3)).tolist()
        wrong += int(max(per_image) > 5.0 or not torch.equal(la, lb))
    return {
        "batches": len(got["cuda"]),
        "batches wrong": wrong,
        "images": len(means),
        "mean |diff| median": float(np.median(means)),
        "mean |diff| p99": float(np.percentile(means, 99)),
        "mean |diff| max": float(max(means)),
        "largest pixel diff, median image": float(np.median(tops)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--cores", default="4,8", help="core counts, comma-separated")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--data-dir", default=str(bl.ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--dry", action="store_true", help="no CUDA: the script's own check")
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.dry:
        _dry()
    if args.case:
        kind, *rest = args.case
        res: dict[str, float]
        if kind == "loader":
            cores = [int(c) for c in rest[3].split(",")]
            res = case_loader(
                rest[0], rest[1], rest[2], cores, args.batch_size, args.epochs, rest[4]
            )
        elif kind == "warm":
            res = case_warm(rest[0], rest[1])
        elif kind == "raw":
            res = case_raw(rest[0], args.batch_size)
        else:
            res = case_pixels(rest[0], rest[1])
        res["rss_mb"] = bl._peak_rss_mb()
        print(json.dumps(res))
        return

    import tempfile

    import numpy as np
    import torch

    from asyncloader.testing import TEST_ENV, S3TestServer
    from asyncloader.testing._demo import make_jpeg_folder

    if not torch.cuda.is_available() and not args.dry:
        sys.exit("bench_gpu_decode.py needs a CUDA device")
    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0)
    every = sorted(os.sched_getaffinity(0))
    counts = [n for n in (int(c) for c in args.cores.split(",")) if n <= len(every)]
    cases: dict[str, tuple[str, str, str]] = {}
    labels: dict[str, str] = {}
    for n in counts:
        few = ",".join(str(c) for c in every[:n])
        cases[f"gpu-{n}"], labels[f"gpu-{n}"] = ("cuda", few, "process"), f"GPU decode, {n} cores"
        cases[f"gpu-inline-{n}"] = ("cuda", few, "inline")
        labels[f"gpu-inline-{n}"] = f"GPU decode inline, {n} cores"
        cases[f"cpu-{n}"], labels[f"cpu-{n}"] = ("thread", few, "process"), f"CPU decode, {n} cores"
    cases["cpu-all"] = ("thread", ",".join(map(str, every)), "process")
    labels["cpu-all"] = f"CPU decode, {len(every)} cores"
    common = ["--batch-size", str(args.batch_size), "--epochs", str(args.epochs)]
    common += ["--dry"] if args.dry else []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    with (
        tempfile.TemporaryDirectory() as cache,
        S3TestServer(load=folder, bucket="b", prefix="train/") as srv,
    ):
        bl.run_case(["warm", srv.endpoint, cache], __file__)
        for _ in range(args.rounds):
            for name, (backend, on, mode) in cases.items():
                r = bl.run_case(
                    ["loader", srv.endpoint, cache, backend, on, mode, *common], __file__
                )
                runs[name].append(r)
                print(name, json.dumps(r), flush=True)
        dry = ["--dry"] if args.dry else []
        pixels = bl.run_case(["pixels", srv.endpoint, cache, *dry], __file__)
    raw = {} if args.dry else bl.run_case(["raw", str(folder), *common], __file__)

    gpu = "the CPU (--dry: figures of nothing)" if args.dry else torch.cuda.get_device_name()
    print(
        f"\n{args.images} JPEGs (~{_mean_size(folder)}), RandomResizedCrop(224), batch "
        f"{args.batch_size}, float16 into {gpu}, warm SSD cache; medians of {args.rounds} "
        f"interleaved rounds, {args.epochs} epochs each"
    )
    print(
        f"{'case':28s} {'img/s':>8s} {'x cpu':>6s} {'x cpu-all':>9s} "
        f"{'CPU ms/img':>10s} {'trainer ms/img':>14s} {'peak MB':>8s}"
    )
    rate = {n: float(np.median([r["images"] / r["wall"] for r in rs])) for n, rs in runs.items()}
    for name, rs in runs.items():
        cpu_ms = float(np.median([r["cpu"] / r["images"] * 1e3 for r in rs]))
        trainer_ms = float(np.median([r["trainer_cpu"] / r["images"] * 1e3 for r in rs]))
        rss = float(np.median([r["rss_mb"] for r in rs]))
        same = "cpu-" + name.split("-")[-1] if name != "cpu-all" else name
        print(
            f"{labels[name]:28s} {rate[name]:8.0f} {rate[name] / rate[same]:6.2f} "
            f"{rate[name] / rate['cpu-all']:9.2f} {cpu_ms:10.3f} {trainer_ms:14.3f} {rss:8.0f}"
        )
    for n in counts:
        for name in (f"gpu-{n}", f"gpu-inline-{n}"):
            last = runs[name][-1]
            print(
                f"{labels[name]}: samples decoded by the CPU instead: {last.get('on_cpu')} "
                f"(of which failed the check of the GPU's image: {last.get('suspect')}); "
                f"on the GPU {last.get('on_gpu')}, of which by nvJPEG's hardware decoder "
                f"{last.get('hardware')} ({last.get('engines')} engines; -1: not known)"
            )
            parts = {k[8:-7]: v for k, v in last.items() if k.startswith("trainer ") and "/" in k}
            print(
                f"{labels[name]}: the training process's CPU ms/img by part (nested): "
                + ", ".join(f"{k} {v:.4f}" for k, v in sorted(parts.items()))
            )
    print("\nthe decoders alone (no crop, no loader):", json.dumps(raw, indent=1))
    print("\nGPU against CPU pixels, same seed (levels of 255):", json.dumps(pixels, indent=1))


def _mean_size(folder: Path) -> str:
    files = bl._files(folder)
    return f"{sum(f.stat().st_size for f in files) / len(files) / 1e3:.0f} KB each"


if __name__ == "__main__":
    main()
