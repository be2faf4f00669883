"""GPU decode (``DecodeConfig(backend="cuda")``, ``_decode/_gpu.py``).

Everywhere: the resize law against Pillow's (property test), and the pool's machinery on
the CPU with a whole-image Pillow decoder in nvJPEG's place (batching, the CPU path for
what nvJPEG is not given or refuses, skips, the ring on a device).  On a GPU (marked
``cuda``; skipped without one): the loader with nvJPEG against the CPU path, same seed.
"""

from __future__ import annotations

import asyncio
import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._base._stats import Counters
from asyncloader._base._types import DecodeJob, DecodePath, Outcome
from asyncloader._decode._gpu import GpuDecodePool
from asyncloader._decode._gpu_batch import _CROP_MAX, _WEIGHTS_MAX, _groups
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader._decode._resample import crops, resample, spans, weights, windows
from asyncloader._decode._ship import jpeg_header
from asyncloader._decode._transforms import RandomResizedCrop, Resize
from asyncloader.testing import S3TestServer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _pillow(box: tuple[float, float, float, float], size: tuple[int, int], img: Image.Image):  # type: ignore[no-untyped-def]
    return np.asarray(img.resize(size, Image.Resampling.BILINEAR, box=box)).transpose(2, 0, 1)


_image = st.tuples(
    st.integers(8, 120),  # width
    st.integers(8, 120),  # height
    st.tuples(st.floats(0, 1), st.floats(0, 1)),  # the box's left and right, as fractions
    st.tuples(st.floats(0, 1), st.floats(0, 1)),  # its top and bottom
    st.booleans(),  # flipped
)


@settings(max_examples=60, deadline=None)
@given(
    images=st.lists(_image, min_size=1, max_size=4),
    out_w=st.integers(1, 64),
    out_h=st.integers(1, 64),
    seed=st.integers(0, 2**16),
)
def test_the_resize_law_is_pillows_bilinear(
    images: list[tuple[int, int, tuple[float, float], tuple[float, float], bool]],
    out_w: int,
    out_h: int,
    seed: int,
) -> None:
    """A group of images of different sizes, boxes and flips, gathered and resized
    together: each one Pillow's BILINEAR resize of its box (float edges included), up to
    Pillow's rounding to 8 bits between its two passes: at most one level apart."""
    rng = np.random.default_rng(seed)
    pixels, boxes, wants = [], [], []
    for w, h, fx, fy, flip in images:
        one = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        x0, x1 = sorted(fx)
        y0, y1 = sorted(fy)
        left, top = x0 * (w - 1), y0 * (h - 1)
        box = (left, top, min(left + max((x1 - x0) * w, 1), w), min(top + max((y1 - y0) * h, 1), h))
        want = _pillow(box, (out_w, out_h), Image.fromarray(one))
        pixels.append(one)
        boxes.append(box)
        wants.append(want[:, :, ::-1] if flip else want)
    box = np.array(boxes, np.float64)
    size = np.array([(w, h) for w, h, *_ in images], np.float64)
    win_x = windows(box[:, 0], box[:, 2], size[:, 0], out_w)
    win_y = windows(box[:, 1], box[:, 3], size[:, 1], out_h)
    (x0s, nx), (y0s, ny) = spans(win_x), spans(win_y)
    flat = torch.cat([torch.from_numpy(p.transpose(2, 0, 1).reshape(3, -1)) for p in pixels], 1)
    area = size[:, 0] * size[:, 1]
    place = torch.from_numpy(
        np.array([np.cumsum(area) - area, size[:, 0], size[:, 1], x0s, y0s], np.int64)
    )
    flips = torch.tensor([flip for *_, flip in images])
    wx = weights(torch.from_numpy(win_x), int(nx.max()), flips)
    wy = weights(torch.from_numpy(win_y), int(ny.max()))
    got = resample(crops(flat, place, int(nx.max()), int(ny.max())), wx, wy)
    got_u8 = got.round().clamp(0, 255).to(torch.uint8).numpy()
    for one, want in zip(got_u8, wants, strict=True):
        assert np.abs(one.astype(int) - want.astype(int)).max() <= 1


@settings(max_examples=100, deadline=None)
@given(
    spans_=st.lists(st.tuples(st.integers(1, 6000), st.integers(1, 6000)), min_size=1, max_size=40),
    out=st.sampled_from([(1, 1), (224, 224), (1024, 768)]),
)
def test_resize_groups_hold_every_image_once_within_their_limits(
    spans_: list[tuple[int, int]], out: tuple[int, int]
) -> None:
    """The batcher's groups: every image in exactly one, smallest crop first, each group
    within its weights' and padded crops' limits unless it holds a single image."""
    nx = np.array([x for x, _ in spans_], np.int64)
    ny = np.array([y for _, y in spans_], np.int64)
    groups = _groups(nx, ny, *out)
    order = np.concatenate(groups)
    assert sorted(order.tolist()) == list(range(len(spans_)))
    assert np.all(np.diff(nx[order] * ny[order]) >= 0)
    for group in groups:
        kx, ky = int(nx[group].max()), int(ny[group].max())
        if len(group) > 1:
            assert len(group) * (out[0] * kx + out[1] * ky) <= _WEIGHTS_MAX
            assert len(group) * kx * ky <= _CROP_MAX


def _whole_pillow(data: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
    """nvJPEG's part played on the CPU: whole images, RGB, [3, H, W] (for the pool's
    machinery; nvJPEG itself runs in the CUDA tests)."""
    out: list[torch.Tensor | BaseException] = []
    for one in data:
        try:
            img = Image.open(io.BytesIO(one.numpy().tobytes())).convert("RGB")
            out.append(torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()))
        except Exception as exc:
            out.append(exc)
    return out


def _run(pool: GpuDecodePool, jobs: list[DecodeJob]) -> list[Outcome | BaseException]:
    async def go() -> list[object]:
        try:
            return list(await pool.decode_many(jobs))
        finally:
            await pool.drain()
            await pool.aclose()

    return asyncio.run(go())  # type: ignore[return-value]


def _files(folder: Path, n: int) -> list[bytes]:
    return [p.read_bytes() for p in sorted(folder.rglob("*.jpg"))[:n]]


@pytest.mark.parametrize("transform", [RandomResizedCrop(64), Resize(48, 56)])
def test_the_pool_writes_each_sample_as_the_plan_says(
    jpeg_folder: Path, transform: RandomResizedCrop | Resize
) -> None:
    """Every sample lands in its slot and index: the whole image, the same crop box as the
    CPU path (same seed), resized by Pillow's law: within a level of Pillow's resize of
    the whole decode, and close to the CPU path's pixels (which decodes at a DCT scale)."""
    data = _files(jpeg_folder, 12)
    h, w = transform.output_size
    spec = DecodeSpec((3, h, w), transform)
    ring = torch.zeros((2, 8, 3, h, w), dtype=torch.uint8)
    pool = GpuDecodePool(2, spec, ring, decode_batch=_whole_pillow, max_batch=5)
    jobs = [DecodeJob(d, i // 8, i % 8, 1000 + i, f"k{i}", "", len(d)) for i, d in enumerate(data)]
    outcomes = _run(pool, jobs)
    assert all(isinstance(o, Outcome) for o in outcomes), outcomes
    assert pool.on_cpu == 0 and pool.batches >= 3  # at most 5 a batch
    diffs = []
    for job, d in zip(jobs, data, strict=True):
        img = Image.open(io.BytesIO(d)).convert("RGB")
        plan = transform.plan(*img.size, random.Random(job.seed))
        want = _pillow(plan.box, plan.size, img)
        if plan.flip:
            want = want[:, :, ::-1]
        got = ring[job.slot, job.index].numpy().astype(int)
        assert np.abs(got - want.astype(int)).max() <= 1
        cpu = np.empty((3, h, w), np.uint8)
        decode_into(d, cpu, spec, job.seed, job.key)
        diffs.append(np.abs(got - cpu.astype(int)).mean())
    # The CPU path decodes at 1/2..1/8 scale where the crop allows (libjpeg's DCT scaling, a
    # low-pass of its own): a few levels apart where it does (Resize(48, 56): ~3.3).
    assert np.mean(diffs) < 4.0, diffs


def test_what_nvjpeg_is_not_given_or_refuses_is_decoded_by_the_cpu(jpeg_folder: Path) -> None:
    """A PNG and a CMYK JPEG go to the CPU path; a JPEG the batch decoder refuses too: all
    three with the CPU path's own pixels.  A truncated JPEG and bytes that are no image
    fail as the CPU path fails (DecodeError)."""
    good = _files(jpeg_folder, 3)
    img = Image.open(io.BytesIO(good[0]))
    png = io.BytesIO()
    img.save(png, "PNG")
    cmyk = io.BytesIO()
    img.convert("CMYK").save(cmyk, "JPEG")
    refused = good[1]
    samples = [png.getvalue(), cmyk.getvalue(), refused, good[2], good[2][:5000], b"<html>"]
    spec = DecodeSpec((3, 32, 32), RandomResizedCrop(32))

    def picky(data: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
        out = _whole_pillow(data)
        return [
            RuntimeError("nvjpeg: unsupported") if d.numel() == len(refused) else o
            for d, o in zip(data, out, strict=True)
        ]

    ring = torch.zeros((1, 6, 3, 32, 32), dtype=torch.uint8)
    pool = GpuDecodePool(2, spec, ring, decode_batch=picky)
    jobs = [DecodeJob(d, 0, i, 7 + i, f"k{i}", "", len(d)) for i, d in enumerate(samples)]
    outcomes = _run(pool, jobs)
    for i in range(3):
        assert isinstance(outcomes[i], Outcome), outcomes[i]
        cpu = np.empty((3, 32, 32), np.uint8)
        decode_into(samples[i], cpu, spec, jobs[i].seed, "k")
        assert np.array_equal(ring[0, i].numpy(), cpu)
    assert isinstance(outcomes[3], Outcome)
    for bad in outcomes[4:]:
        assert isinstance(bad, al.DecodeError), bad
    assert pool.on_cpu == 3


def test_an_image_the_decoder_skipped_is_decoded_on_the_cpu_and_counted(
    jpeg_folder: Path,
) -> None:
    """A decoder that reports success for images it did not decode — one black throughout
    (as hardware decoders were seen to), one of the wrong size, one refused — never
    delivers them: each is decoded by the CPU path and its pixels delivered, and stats()
    counts where every sample went.  A photo that is black throughout is decoded again on
    the CPU and stays black."""
    data = _files(jpeg_folder, 6)
    black = io.BytesIO()
    Image.new("RGB", (60, 40)).save(black, "JPEG")
    data.append(black.getvalue())
    skipped, shrunk, refused = data[0], data[1], data[2]
    spec = DecodeSpec((3, 32, 32), RandomResizedCrop(32))

    def lying(batch: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
        out: list[torch.Tensor | BaseException] = []
        for d, image in zip(batch, _whole_pillow(batch), strict=True):
            assert isinstance(image, torch.Tensor)
            if d.numel() == len(skipped):
                image = torch.zeros_like(image)  # "decoded": nothing written
            elif d.numel() == len(shrunk):
                image = image[:, : image.shape[1] // 2]
            elif d.numel() == len(refused):
                out.append(RuntimeError("nvjpeg: unsupported"))
                continue
            out.append(image)
        return out

    ring = torch.zeros((1, 8, 3, 32, 32), dtype=torch.uint8)
    pool = GpuDecodePool(2, spec, ring, decode_batch=lying)
    jobs = [DecodeJob(d, 0, i, 40 + i, f"k{i}", "", len(d)) for i, d in enumerate(data)]
    outcomes = _run(pool, jobs)
    paths = []
    counters = Counters()
    for job, outcome in zip(jobs, outcomes, strict=True):
        assert isinstance(outcome, Outcome), outcome
        paths.append(outcome.path)
        counters.count_decode(outcome)
        got = ring[0, job.index].numpy()
        if outcome.path is DecodePath.GPU:  # the plan's box resized by Pillow's law
            img = Image.open(io.BytesIO(job.data)).convert("RGB")  # type: ignore[arg-type]
            plan = spec.transform.plan(*img.size, random.Random(job.seed))  # type: ignore[union-attr]
            want = _pillow(plan.box, plan.size, img)
            want = want[:, :, ::-1] if plan.flip else want
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, job.key
        else:  # the CPU path's own pixels
            cpu = np.empty((3, 32, 32), np.uint8)
            decode_into(job.data, cpu, spec, job.seed, job.key)  # type: ignore[arg-type]
            assert np.array_equal(got, cpu), job.key
    assert paths == [
        DecodePath.GPU_SUSPECT,
        DecodePath.GPU_SUSPECT,
        DecodePath.GPU_TO_CPU,
        DecodePath.GPU,
        DecodePath.GPU,
        DecodePath.GPU,
        DecodePath.GPU_SUSPECT,  # black throughout: checked on the CPU, black there too
    ]
    assert ring[0, 6].max() == 0
    stats = counters.snapshot(decode_workers=2, max_inflight=8)
    assert (stats.gpu_decoded, stats.gpu_to_cpu, stats.gpu_suspect) == (3, 1, 3)
    assert "GPU decode: 3 on the GPU (hardware decoder not known), 1 on the CPU" in stats.summary()


def test_gpu_decode_needs_a_gpu_and_says_so(light_server: S3TestServer) -> None:
    opts = {"endpoint_url": light_server.endpoint, "anonymous": True}
    with pytest.raises(ValueError, match="needs device='cuda'"):
        al.ImageLoader(
            "s3://b/train/",
            batch_size=4,
            decode=al.DecodeConfig(backend="cuda"),
            store=al.StoreConfig(options=opts),
        )
    with pytest.raises(ValueError, match="it takes no hook"):
        al.ImageLoader(
            "s3://b/train/",
            batch_size=4,
            device="cuda",
            decode=al.DecodeConfig(
                backend="cuda", hook=lambda b: np.zeros((1, 1, 1), np.uint8), sample_shape=(1, 1, 1)
            ),
            store=al.StoreConfig(options=opts),
        )
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            al.ImageLoader(
                "s3://b/train/",
                batch_size=4,
                device="cuda",
                decode=al.DecodeConfig(backend="cuda"),
                store=al.StoreConfig(options=opts),
            )


# --- on a GPU -----------------------------------------------------------------------------


def _epoch(loader: al.ImageLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(0)
    return [(images.cpu().clone(), labels.cpu().clone()) for images, labels in loader]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("cache", [False, True])
def test_cuda_decode_gives_the_cpu_paths_batches(
    light_server: S3TestServer, tmp_path: Path, cache: bool
) -> None:
    """Same seed, same batches: the same labels in the same order, and pixels within the
    stated tolerance of the CPU path's: per image, a mean absolute difference of at most
    2 levels of 255 for most images (the median) and 5 for any (README)."""
    kw = {
        "batch_size": 16,
        "seed": 3,
        "dtype": "uint8",
        "store": al.StoreConfig(options={"endpoint_url": light_server.endpoint, "anonymous": True}),
    }
    with al.ImageLoader("s3://b/train/", device="cuda", **kw) as cpu:
        want = _epoch(cpu)
    cache_kw = {"cache_dir": tmp_path / "cache"} if cache else {}
    with al.ImageLoader(
        "s3://b/train/", device="cuda", **cache_kw, **kw, decode=al.DecodeConfig(backend="cuda")
    ) as gpu:
        assert gpu.decode_backend == "cuda"
        got = _epoch(gpu)
        if cache:
            again = _epoch(gpu)  # from the cache
            assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, again, strict=True))
    assert len(got) == len(want)
    diffs = []
    for (a, la), (b, lb) in zip(got, want, strict=True):
        assert torch.equal(la, lb)
        assert a.shape == b.shape and a.dtype == torch.uint8
        diffs += (a.float() - b.float()).abs().mean(dim=(1, 2, 3)).tolist()
    print("mean |GPU - CPU| per image: median", np.median(diffs), "max", max(diffs))
    assert np.median(diffs) <= 2.0 and max(diffs) <= 5.0, sorted(diffs)[-5:]


@pytest.mark.cuda
@needs_cuda
def test_cuda_decode_skips_what_the_cpu_path_skips(tmp_path: Path, jpeg_folder: Path) -> None:
    """Corrupt and truncated samples are counted skips under on_error="skip", the same
    ones as the CPU path's, and a CMYK JPEG is decoded (by the CPU): never a crash."""
    files = sorted(jpeg_folder.rglob("*.jpg"))[:24]
    root = tmp_path / "data"
    for i, f in enumerate(files):
        d = f.read_bytes()
        if i == 3:
            d = d[: len(d) // 2]
        if i == 5:
            d = b"<html>not an image</html>"
        if i == 7:
            buf = io.BytesIO()
            Image.open(f).convert("CMYK").save(buf, "JPEG")
            d = buf.getvalue()
        (root / f.parent.name).mkdir(parents=True, exist_ok=True)
        (root / f.parent.name / f.name).write_bytes(d)
    with S3TestServer(load=root, bucket="b", prefix="t/") as srv:
        kw = {
            "batch_size": 8,
            "shuffle": False,
            "errors": al.ErrorConfig(on_error="skip", max_failures=0.5),
            "device": "cuda",
            "dtype": "uint8",
            "store": al.StoreConfig(options={"endpoint_url": srv.endpoint, "anonymous": True}),
        }
        with al.ImageLoader("s3://b/t/", **kw) as cpu:
            want = _epoch(cpu)
            cpu_skipped = cpu.stats().skipped
        with al.ImageLoader("s3://b/t/", **kw, decode=al.DecodeConfig(backend="cuda")) as gpu:
            got = _epoch(gpu)
            gpu_skipped = gpu.stats().skipped
    assert cpu_skipped == gpu_skipped and sum(cpu_skipped.values()) == 2
    assert [la.tolist() for _, la in got] == [la.tolist() for _, la in want]


@pytest.mark.cuda
@needs_cuda
def test_cuda_decode_slow_consumer_never_sees_a_reused_slot(light_server: S3TestServer) -> None:
    """Two slots on the device and a consumer slower than the decoder: a batch handed out
    is a copy of its slot, taken before the slot is refilled."""
    kw = {
        "batch_size": 16,
        "seed": 9,
        "engine": al.EngineConfig(prefetch_batches=2),
        "dtype": "uint8",
        "device": "cuda",
        "decode": al.DecodeConfig(backend="cuda"),
        "store": al.StoreConfig(options={"endpoint_url": light_server.endpoint, "anonymous": True}),
    }
    with al.ImageLoader("s3://b/train/", **kw) as loader:
        want = _epoch(loader)
        loader.set_epoch(0)
        for (images, _), (expected, _) in zip(loader, want, strict=True):
            torch.cuda._sleep(50_000_000)
            assert torch.equal(images.cpu(), expected)


def test_the_header_reader_agrees_with_pillow(jpeg_folder: Path) -> None:
    """Size and components from the markers, as Pillow reads them; None for what nvJPEG is
    not given (not a JPEG, truncated, lossless or arithmetic-coded, 12-bit samples)."""
    for d in _files(jpeg_folder, 20):
        img = Image.open(io.BytesIO(d))
        assert jpeg_header(d) == (*img.size, 3)
    img = Image.open(io.BytesIO(_files(jpeg_folder, 1)[0]))
    for mode, kw, comps in [("L", {}, 1), ("CMYK", {}, 4), ("RGB", {"progressive": True}, 3)]:
        buf = io.BytesIO()
        img.convert(mode).save(buf, "JPEG", **kw)
        assert jpeg_header(buf.getvalue()) == (*img.size, comps), mode
    png = io.BytesIO()
    img.save(png, "PNG")
    d = _files(jpeg_folder, 1)[0]
    sof = d.index(b"\xff\xc0")
    for bad in (
        png.getvalue(),
        d[:-100],
        b"",
        b"\xff\xd8\xff\xd9",
        d[: sof + 1] + b"\xc3" + d[sof + 2 :],
        d[: sof + 4] + b"\x0c" + d[sof + 5 :],  # the precision byte: 12 bits
    ):
        assert jpeg_header(bad) is None
