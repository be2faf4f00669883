"""GPU decode with engine processes: the engine ships each JPEG and its crop plan into its
ring slot (``_decode/_ship.py``), the training process decodes the batch on its GPU
(``_decode/_gpu_batch.py``: ``ShipUnpacker``).

Everywhere: the ring's arena and records across a process boundary, what the engine ships
and what it decodes itself, the training process's half with a whole-image Pillow decoder
in nvJPEG's place (the check, the CPU path where it takes over, skips), and the loader end
to end through engine processes (the GPU's part on the CPU, as in ``test_gpu_decode``).
On a GPU (marked ``cuda``): the same loader with nvJPEG, against the CPU path.
"""

from __future__ import annotations

import asyncio
import errno
import io
import itertools
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import asyncloader as al
from asyncloader._base._stats import Counters
from asyncloader._base._types import DecodeJob, DecodePath, Outcome, Shipped
from asyncloader._decode._gpu_batch import ShipUnpacker
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader._decode._ship import Shipper
from asyncloader._decode._threads import ThreadDecodePool
from asyncloader._decode._transforms import RandomResizedCrop
from asyncloader._device._ring import BatchRing
from asyncloader.testing import S3TestServer

from .test_engines import _engine_pids
from .test_gpu_decode import _pillow, _whole_pillow

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SPEC = DecodeSpec((3, 32, 32), RandomResizedCrop(32))
ARENA = 256 << 10  # a slot's room per sample in these tests [bytes]: photos of ~100 KB


def _files(folder: Path, n: int) -> list[bytes]:
    return [p.read_bytes() for p in sorted(folder.rglob("*.jpg"))[:n]]


def _shipper(ring: BatchRing) -> Shipper:
    assert ring.records is not None and ring.arena is not None
    return Shipper(SPEC, ring.images, ring.records, ring.arena)


def _ship(
    ring: BatchRing, jobs: list[DecodeJob], batch: int = 0, shipper: Shipper | None = None
) -> list[Outcome | BaseException]:
    """The jobs through the engine's decode threads with a shipper, as the stream's batch
    ``batch``."""
    pool = ThreadDecodePool(2, SPEC, ring.images, shipper or _shipper(ring))

    async def go() -> list[Outcome | BaseException]:
        try:
            return await pool.decode_many(jobs, batch)
        finally:
            await pool.drain()
            await pool.aclose()

    return asyncio.run(go())


def _odd_ones(good: bytes) -> tuple[bytes, bytes]:
    """A PNG and a CMYK JPEG of the same photo: what nvJPEG is not given."""
    img = Image.open(io.BytesIO(good))
    png, cmyk = io.BytesIO(), io.BytesIO()
    img.save(png, "PNG")
    img.convert("CMYK").save(cmyk, "JPEG")
    return png.getvalue(), cmyk.getvalue()


def test_a_shipped_ring_hands_its_records_and_bytes_to_the_process_that_maps_it(
    jpeg_folder: Path,
) -> None:
    """The engine's side writes into a ring the trainer made; another process maps the same
    segment and reads the same records, bytes and pixels; a lease is a Shipped batch that
    holds its slot; compacting a batch moves its records with its pixels and labels."""
    data = _files(jpeg_folder, 4)
    png, _ = _odd_ones(data[0])
    samples = [data[0], png, data[1], data[2]]
    ring = BatchRing(3, 4, (3, 32, 32), shared=True, arena=4 * ARENA)
    try:
        jobs = [DecodeJob(d, 1, i, 50 + i, f"photos/{i}.jpg") for i, d in enumerate(samples)]
        outcomes = _ship(ring, jobs)
        assert [o.path for o in outcomes if isinstance(o, Outcome)] == [
            DecodePath.SHIPPED,
            DecodePath.GPU_TO_CPU,
            DecodePath.SHIPPED,
            DecodePath.SHIPPED,
        ]
        assert ring.records is not None and ring.arena is not None
        rec = ring.records[1]
        assert rec["shipped"].tolist() == [1, 0, 1, 1]
        # In the arena one after the other (in the order the threads took them), each
        # followed by its key; nothing overlaps.
        spans = sorted(
            (int(r["offset"]), int(r["offset"] + r["length"] + r["key_length"]))
            for r in rec
            if r["shipped"]
        )
        assert spans[0][0] == 0 and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        code = (
            "import sys, json, numpy as np\n"
            "from asyncloader._base._shm import SegmentRef\n"
            "from asyncloader._device._ring import BatchRing\n"
            f"ring = BatchRing(3, 4, (3, 32, 32), shared=True, attach=SegmentRef(*json.loads(sys.argv[1])), arena={4 * ARENA})\n"
            "r = ring.records[1]\n"
            "print(json.dumps([r['seed'].tolist(), r['width'].tolist(), "
            "[bytes(ring.arena[1][o:o + n]).hex()[:16] for o, n in zip(r['offset'].tolist(), r['length'].tolist())], "
            "int(ring.images[1, 1].sum())]))\n"
            "ring.close()\n"
        )
        ref = ring.ref
        assert ref is not None
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps([ref.size, ref.fd, ref.name])],
            capture_output=True,
            text=True,
            check=True,
            pass_fds=ref.fds,
        )
        seeds, widths, heads, png_sum = json.loads(done.stdout)
        assert seeds == [50, 51, 52, 53]
        for i in (0, 2, 3):
            assert widths[i] == Image.open(io.BytesIO(samples[i])).size[0]
            assert heads[i] == samples[i][:8].hex()
        assert png_sum == int(ring.images[1, 1].sum()) > 0  # the PNG decoded by the engine
        cpu = np.empty((3, 32, 32), np.uint8)
        decode_into(png, cpu, SPEC, 51, "k")
        assert np.array_equal(ring.images[1, 1], cpu)

        images, labels = ring.lease(1, 4)
        assert isinstance(images, Shipped) and images.shape == (4, 3, 32, 32)
        assert ring.held == 1
        del images, labels
        assert ring.held == 0
        before = ring.records[1].copy()
        ring.compact(1, [1, 3])
        assert ring.records[1][:2].tobytes() == before[[1, 3]].tobytes()
    finally:
        ring.close()


def test_a_shipped_ring_without_room_says_what_to_make_smaller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every page of a ring is reserved when it is made; a shipped ring that does not fit
    fails there, naming the room for the shipped JPEGs beside the usual fixes."""

    def no_memory(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(os, "posix_fallocate", no_memory)
    with pytest.raises(al.AsyncLoaderError, match=r"ship_bytes=.*batch_size.*prefetch_batches"):
        BatchRing(5, 256, (3, 224, 224), shared=True, arena=256 * (512 << 10))


def test_what_does_not_fit_the_arena_is_decoded_by_the_engine(jpeg_folder: Path) -> None:
    """A batch's bytes fill its slot's arena from the start; a JPEG that no longer fits is
    decoded on the CPU by the engine (its pixels in the slot), and the slot's next batch
    starts from the start of the arena again."""
    data = _files(jpeg_folder, 6)
    room = len(data[0]) + len(data[1]) + 40  # two photos and their keys
    ring = BatchRing(2, 6, (3, 32, 32), shared=True, arena=room)
    try:
        shipper = _shipper(ring)
        jobs = [DecodeJob(d, 0, i, i, f"k{i}") for i, d in enumerate(data[:2])]
        outcomes = _ship(ring, jobs, 0, shipper)
        assert all(isinstance(o, Outcome) and o.path is DecodePath.SHIPPED for o in outcomes)
        late = [DecodeJob(data[2], 0, 2, 2, "k2")]
        (outcome,) = _ship(ring, late, 0, shipper)  # the same batch: no room left
        assert isinstance(outcome, Outcome) and outcome.path is DecodePath.GPU_TO_CPU
        cpu = np.empty((3, 32, 32), np.uint8)
        decode_into(data[2], cpu, SPEC, 2, "k2")
        assert np.array_equal(ring.images[0, 2], cpu)
        (outcome,) = _ship(ring, late, 1, shipper)  # the slot's next batch
        assert isinstance(outcome, Outcome) and outcome.path is DecodePath.SHIPPED
        assert ring.records is not None and int(ring.records[0, 2]["offset"]) == 0
    finally:
        ring.close()


def _shipped_batch(
    folder: Path, samples: list[bytes] | None = None
) -> tuple[BatchRing, list[bytes], list[DecodeJob]]:
    data = samples if samples is not None else _files(folder, 8)
    ring = BatchRing(2, len(data), (3, 32, 32), shared=True, arena=len(data) * ARENA)
    jobs = [DecodeJob(d, 0, i, 900 + i, f"photos/{i}.jpg") for i, d in enumerate(data)]
    for o in _ship(ring, jobs):
        assert isinstance(o, Outcome), o
    ring.labels[0, : len(data)] = np.arange(len(data))
    return ring, data, jobs


def _unpack(
    ring: BatchRing, unpacker: ShipUnpacker, n: int, extras: dict[str, list[object]] | None = None
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, dict[str, list[object]]]]:
    images, labels = ring.lease(0, n)
    assert isinstance(images, Shipped)
    return unpacker(images, torch.from_numpy(labels), (7, n, extras or {}))


def test_the_training_process_decodes_a_shipped_batch_as_the_plans_say(jpeg_folder: Path) -> None:
    """Every shipped sample decoded whole and resized by Pillow's law from its engine's
    plan (within a level of Pillow's resize of the whole decode); the engine's own samples
    copied as they are; the slot let go once the batch is made; stats() counts each."""
    data = _files(jpeg_folder, 6)
    png, cmyk = _odd_ones(data[0])
    ring, samples, jobs = _shipped_batch(jpeg_folder, [*data, png, cmyk])
    counters = Counters()
    try:
        unpacker = ShipUnpacker(
            SPEC, torch.device("cpu"), counters, skip=False, decode_batch=_whole_pillow
        )
        images, labels, meta = _unpack(ring, unpacker, len(samples))
        assert ring.held == 0  # the slot went back as soon as its bytes were read
        assert images.shape == (8, 3, 32, 32) and labels.tolist() == list(range(8))
        assert meta == (7, 8, {})
        for job, got in zip(jobs, images, strict=True):
            if job.index < 6:
                img = Image.open(io.BytesIO(samples[job.index])).convert("RGB")
                plan = SPEC.transform.plan(*img.size, random.Random(job.seed))  # type: ignore[union-attr]
                want = _pillow(plan.box, plan.size, img)
                want = want[:, :, ::-1] if plan.flip else want
                assert np.abs(got.numpy().astype(int) - want.astype(int)).max() <= 1
            else:  # the engine's CPU path
                cpu = np.empty((3, 32, 32), np.uint8)
                decode_into(samples[job.index], cpu, SPEC, job.seed, job.key)
                assert np.array_equal(got.numpy(), cpu)
        assert (counters.gpu_decoded, counters.gpu_to_cpu, counters.gpu_suspect) == (6, 0, 0)
    finally:
        ring.close()


def test_an_image_the_gpu_skipped_or_refused_is_decoded_on_the_cpu_here(jpeg_folder: Path) -> None:
    """A decoder that reports a black image for one it skipped, and refuses another: both
    decoded by the CPU path in the training process from the shipped bytes (the engine's
    seed, so its crop), counted as such."""
    ring, samples, jobs = _shipped_batch(jpeg_folder)
    skipped, refused = len(samples[1]), len(samples[4])

    def lying(batch: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
        out: list[torch.Tensor | BaseException] = []
        for d, image in zip(batch, _whole_pillow(batch), strict=True):
            assert isinstance(image, torch.Tensor)
            if d.numel() == skipped:
                out.append(torch.zeros_like(image))
            elif d.numel() == refused:
                out.append(RuntimeError("nvjpeg: unsupported"))
            else:
                out.append(image)
        return out

    counters = Counters()
    try:
        unpacker = ShipUnpacker(SPEC, torch.device("cpu"), counters, skip=False, decode_batch=lying)
        images, _, _ = _unpack(ring, unpacker, len(samples))
        for i in (1, 4):
            cpu = np.empty((3, 32, 32), np.uint8)
            decode_into(samples[i], cpu, SPEC, jobs[i].seed, jobs[i].key)
            assert np.array_equal(images[i].numpy(), cpu), i
        assert (counters.gpu_decoded, counters.gpu_to_cpu, counters.gpu_suspect) == (6, 1, 1)
    finally:
        ring.close()


class _BaselineOnly:
    """nvJPEG's hardware rule played on the CPU (for the counting; nvJPEG's own answer is
    the CUDA test's): a GPU with two engines that take baseline JPEGs, not progressive."""

    engines = 2

    def takes(self, jpeg: torch.Tensor) -> bool:
        return not Image.open(io.BytesIO(jpeg.numpy().tobytes())).info.get("progressive")


def test_what_the_hardware_decoder_takes_is_counted_with_its_engines(jpeg_folder: Path) -> None:
    """Of the samples decoded on the GPU, those the hardware decoder takes are counted in
    gpu_hardware (a progressive JPEG is not; one that fails the check is the CPU's even
    where the hardware took it), and the engines it reports reach stats() and summary()
    through the engines' counters."""
    data = _files(jpeg_folder, 5)
    progressive, black = io.BytesIO(), io.BytesIO()
    Image.open(io.BytesIO(data[0])).save(progressive, "JPEG", progressive=True)
    Image.new("RGB", (60, 40)).save(black, "JPEG")
    ring, samples, _ = _shipped_batch(
        jpeg_folder, [*data, progressive.getvalue(), black.getvalue()]
    )
    counters = Counters()
    try:
        unpacker = ShipUnpacker(
            SPEC,
            torch.device("cpu"),
            counters,
            skip=False,
            decode_batch=_whole_pillow,
            probe=_BaselineOnly(),
        )
        _unpack(ring, unpacker, len(samples))
    finally:
        ring.close()
    assert (counters.gpu_decoded, counters.gpu_hardware, counters.gpu_suspect) == (6, 5, 1)
    assert counters.gpu_engines == 2
    engines = Counters()
    engines.gpu_shipped = len(samples)
    stats = engines.with_consumer(counters).snapshot(decode_workers=2, max_inflight=8)
    assert (stats.gpu_decoded, stats.gpu_hardware, stats.gpu_engines) == (6, 5, 2)
    assert "6 on the GPU (5 by the hardware decoder, 2 engines)" in stats.summary()


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_sample_neither_path_decodes_is_left_out_or_raised(
    jpeg_folder: Path, on_error: str
) -> None:
    """A JPEG whose header is whole and whose data is not: the GPU refuses it, the CPU path
    too.  Under "skip" the batch comes without it — its label and extras too — and it is
    counted and named; under "raise" it is a DecodeError that names the object."""
    data = _files(jpeg_folder, 4)
    broken = data[2][:600] + bytes(len(data[2]) - 602) + b"\xff\xd9"  # the markers kept
    ring, _, _ = _shipped_batch(jpeg_folder, [data[0], data[1], broken, data[3]])

    def refuses_broken(batch: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
        return [
            RuntimeError("nvjpeg: bad data") if d.numel() == len(broken) else o
            for d, o in zip(batch, _whole_pillow(batch), strict=True)
        ]

    counters = Counters()
    unpacker = ShipUnpacker(
        SPEC, torch.device("cpu"), counters, skip=on_error == "skip", decode_batch=refuses_broken
    )
    try:
        if on_error == "raise":
            with pytest.raises(al.DecodeError, match=r"photos/2\.jpg"):
                _unpack(ring, unpacker, 4)
            return
        images, labels, meta = _unpack(ring, unpacker, 4, {"text": ["a", "b", "c", "d"]})
        assert images.shape[0] == 3 and labels.tolist() == [0, 1, 3]
        assert meta == (7, 3, {"text": ["a", "b", "d"]})
        assert sum(counters.skipped.values()) == 1
        assert counters.skipped_keys == ["photos/2.jpg"]
    finally:
        ring.close()


def _gpu_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader's GPU decode with its GPU part played on the CPU: no CUDA check, and the
    whole-image Pillow decoder in nvJPEG's place (in this process: the engines ship)."""
    import asyncloader._decode._gpu_batch as gpu_batch
    import asyncloader._run._build as build

    monkeypatch.setattr(build, "_check_gpu_decode", lambda *a, **k: None)
    monkeypatch.setattr(gpu_batch, "nvjpeg_batch", lambda device: _whole_pillow)


def _options(server: S3TestServer, device: str) -> dict[str, object]:
    """The loader's options of both loaders of a comparison (uint8 batches on ``device``)."""
    return {
        "batch_size": 16,
        "seed": 3,
        "dtype": "uint8",
        "device": device,
        "store": al.StoreConfig(options={"endpoint_url": server.endpoint, "anonymous": True}),
    }


@pytest.mark.parametrize("cache", [False, True])
def test_the_loader_with_engine_processes_ships_and_decodes_in_the_trainer(
    light_server: S3TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: bool
) -> None:
    """GPU decode through engine processes: the same batches, labels and order as the CPU
    path for the same seed, pixels within a level or two; every sample shipped, none
    decoded by the engines; from the cache on the next epoch too."""
    _gpu_on_the_cpu(monkeypatch)
    kw = _options(light_server, "cpu")
    if cache:
        kw["cache_dir"] = tmp_path / "cache"
    with al.ImageLoader("s3://b/train/", **kw) as cpu:
        want = [(x.clone(), y.clone()) for x, y in cpu]
    with al.ImageLoader(
        "s3://b/train/", **kw, decode=al.DecodeConfig(backend="cuda", workers=2)
    ) as gpu:
        assert "engine_processes=1" in repr(gpu)
        epochs = []
        for _ in range(2 if cache else 1):
            gpu.set_epoch(0)
            epochs.append([(x.clone(), y.clone()) for x, y in gpu])
        stats = gpu.stats()
    for got in epochs:
        assert len(got) == len(want)
        diffs = []
        for (a, la), (b, lb) in zip(got, want, strict=True):
            assert torch.equal(la, lb) and a.shape == b.shape
            diffs += (a.float() - b.float()).abs().mean(dim=(1, 2, 3)).tolist()
        assert np.median(diffs) <= 2.0 and max(diffs) <= 5.0
    if cache:
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(*epochs, strict=True))
    assert stats.gpu_decoded == sum(len(y) for _, y in want) * len(epochs)
    assert stats.gpu_to_cpu == stats.gpu_suspect == 0
    assert stats.gpu_shipped >= stats.gpu_decoded
    assert "shipped by the engines to the training process" in stats.summary()


@pytest.mark.cuda
@needs_cuda
def test_cuda_decode_with_engine_processes_gives_the_cpu_paths_batches(
    light_server: S3TestServer,
) -> None:
    """On a GPU: nvJPEG in the training process on what the engines shipped; same labels
    and order as the CPU path, pixels within the stated tolerance (README)."""
    kw = _options(light_server, "cuda")
    with al.ImageLoader("s3://b/train/", **kw) as cpu:
        want = [(x.cpu(), y.cpu()) for x, y in cpu]
    with al.ImageLoader("s3://b/train/", **kw, decode=al.DecodeConfig(backend="cuda")) as gpu:
        assert "engine_processes=" in repr(gpu) and "engine_processes=0" not in repr(gpu)
        got = [(x.cpu(), y.cpu()) for x, y in gpu]
        stats = gpu.stats()
    diffs = []
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(la, lb)
        diffs += (a.float() - b.float()).abs().mean(dim=(1, 2, 3)).tolist()
    assert np.median(diffs) <= 2.0 and max(diffs) <= 5.0, sorted(diffs)[-5:]
    assert stats.gpu_decoded > 0 and stats.gpu_suspect == 0
    # nvJPEG asked through torchvision's own library: the engines it reports, and every
    # one of these baseline JPEGs decoded by the hardware where it has engines.
    assert stats.gpu_engines is not None, "libnvjpeg not found in the process"
    want = stats.gpu_decoded if stats.gpu_engines > 0 else 0
    assert stats.gpu_hardware == want, (stats.gpu_hardware, stats.gpu_decoded, stats.gpu_engines)


def test_a_killed_engine_that_ships_is_replaced_and_the_epoch_is_exact(
    light_server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine process that ships is killed mid-epoch: its replacement ships into a ring
    of its own (arena and records too), and the epoch is the uninterrupted run's, bit for
    bit."""
    _gpu_on_the_cpu(monkeypatch)
    kw = {
        **_options(light_server, "cpu"),
        "batch_size": 8,
        "decode": al.DecodeConfig(backend="cuda", workers=2),
        "engine": al.EngineConfig(processes=2, prefetch_batches=4),
    }
    with al.ImageLoader("s3://b/train/", **kw) as reference:
        want = [(x.clone(), y.clone()) for x, y in reference]
    with al.ImageLoader("s3://b/train/", **kw) as loader:
        it = iter(loader)
        got = [next(it) for _ in range(2)]  # engine 1 made batch 1
        os.kill(_engine_pids()[1], signal.SIGKILL)
        got += [(x.clone(), y.clone()) for x, y in it]
        stats = loader.stats()
    assert stats.engine_restarts == 1
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_what_fails_on_either_side_is_a_counted_skip_as_on_the_cpu_path(
    jpeg_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder with a truncated JPEG (its engine decodes it on the CPU, which refuses it),
    one whose data is gone behind a whole header (shipped; the GPU and then the training
    process's CPU path refuse it) and a PNG (decoded by its engine): under "skip" the same
    samples are left out as on the CPU path, counted and named, the rest delivered in the
    same batches."""
    _gpu_on_the_cpu(monkeypatch)
    root = tmp_path / "data"
    files = sorted(jpeg_folder.rglob("*.jpg"))[:20]
    for i, f in enumerate(files):
        data = f.read_bytes()
        name = f"c{i % 2}/{i:02d}.jpg"
        if i == 3:
            data = data[: len(data) // 2]  # truncated: no end marker
        elif i == 7:
            data = data[:600] + bytes(len(data) - 602) + b"\xff\xd9"  # markers, no data
        elif i == 11:
            name = f"c{i % 2}/{i:02d}.png"
            buf = io.BytesIO()
            Image.open(io.BytesIO(data)).save(buf, "PNG")
            data = buf.getvalue()
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    with S3TestServer(load=root, bucket="b", prefix="train/") as server:
        skip = al.ErrorConfig(on_error="skip", max_failures=5)
        kw = {**_options(server, "cpu"), "errors": skip}
        with al.ImageLoader("s3://b/train/", **kw) as cpu:
            want = [y.tolist() for _, y in cpu]
            cpu_stats = cpu.stats()
        with al.ImageLoader(
            "s3://b/train/", **kw, decode=al.DecodeConfig(backend="cuda", workers=2)
        ) as gpu:
            got = [y.tolist() for _, y in gpu]
            stats = gpu.stats()
    assert got == want and sum(map(len, got)) == 18
    assert sum(stats.skipped.values()) == sum(cpu_stats.skipped.values()) == 2
    assert sorted(stats.skipped_keys) == sorted(cpu_stats.skipped_keys)
    assert any("07.jpg" in k for k in stats.skipped_keys)
    assert stats.gpu_to_cpu >= 1  # the PNG, by its engine
