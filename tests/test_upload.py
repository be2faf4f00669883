"""The uploader: batches delivered on a device, converted and normalised.

The CPU path runs everywhere.  The CUDA tests (marked ``cuda``) skip cleanly without a GPU;
on one they check bit-exact equality with the CPU path, slot reuse under a slow consumer and
copies overlapping compute."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncloader as al
from asyncloader._device._device_spec import DeviceSpec
from asyncloader._device._upload import _Releaser
from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _loader(server: S3TestServer, **kw: object) -> al.ImageLoader:
    kw.setdefault("batch_size", 16)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("seed", 5)
    return al.ImageLoader(
        "s3://b/train/",
        **kw,
        store=al.StoreConfig(options={"endpoint_url": server.endpoint, "anonymous": True}),  # type: ignore[arg-type]
    )


def _epoch(loader: al.ImageLoader, epoch: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch)
    return [(images.cpu().clone(), labels.cpu().clone()) for images, labels in loader]


def _reference(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """Normalised in float64 from the uint8 batches: the values every path must approach."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return [(images.to(torch.float64) / 255 - mean) / std for images, _ in batches]


def _uploader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "asyncloader-uploader"]


@pytest.fixture(scope="module")
def server(jpeg_folder: Path) -> S3TestServer:
    with S3TestServer(load=jpeg_folder, bucket="b", prefix="train/") as srv:
        yield srv  # type: ignore[misc]


@pytest.fixture(scope="module")
def plain(server: S3TestServer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Epoch 0 as uint8 CPU batches (device=None): the input every path converts."""
    with _loader(server) as loader:
        return _epoch(loader)


def test_cpu_device_normalises_in_order(
    server: S3TestServer, plain: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    with _loader(server, device="cpu") as loader:
        assert loader.device == torch.device("cpu")
        got = _epoch(loader)
        stats = loader.stats()
    assert len(got) == len(plain) == -(-N_IMAGES // 16)
    for (images, labels), (u8, lab), ref in zip(got, plain, _reference(plain), strict=True):
        assert images.dtype == torch.float32 and images.shape == u8.shape
        assert torch.equal(labels, lab) and labels.dtype == torch.int64
        assert torch.allclose(images.to(torch.float64), ref, atol=1e-5)
    assert stats.samples == N_IMAGES


def test_dtypes_and_channels_last(
    server: S3TestServer, plain: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    with _loader(
        server, device="cpu", dtype="float16", output=al.OutputConfig(channels_last=True)
    ) as loader:
        got = _epoch(loader)
    for (images, _), ref in zip(got, _reference(plain), strict=True):
        assert images.dtype == torch.float16
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose(images.to(torch.float64), ref, atol=1e-2)
    with _loader(server, device="cpu", dtype="uint8") as loader:
        got = _epoch(loader)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, plain, strict=True))
    with _loader(server, device="cpu", output=al.OutputConfig(mean=None, std=None)) as loader:
        images, _ = next(iter(loader))
    assert torch.allclose(images.double(), plain[0][0].double() / 255, atol=1e-6)


def test_state_dict_counts_what_the_consumer_received(server: S3TestServer) -> None:
    """The uploader runs ahead; a resume must still continue after the last batch the
    training loop got, not the last one the uploader converted."""
    with _loader(server, device="cpu", labels=None) as loader:
        it = iter(loader)
        seen = [next(it)[0].clone() for _ in range(2)]
        time.sleep(0.5)  # let the uploader fill its queue
        state = loader.state_dict()
        assert state["next_batch"] == 2
        del it
    with _loader(server, device="cpu", labels=None) as loader:
        loader.load_state_dict(state)
        rest = [images.clone() for images, _ in loader]
    with _loader(server, device="cpu", labels=None) as loader:
        full = [images.clone() for images, _ in loader]
    assert len(seen) + len(rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(seen + rest, full, strict=True))


def test_break_stops_the_uploader_and_the_next_pass_is_whole(server: S3TestServer) -> None:
    with _loader(server, device="cpu") as loader:
        for i, _ in enumerate(loader):
            if i == 1:
                break
        deadline = time.monotonic() + 10
        while _uploader_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _uploader_threads()
        loader.set_epoch(0)
        assert sum(len(lab) for _, lab in loader) == N_IMAGES
    assert not _uploader_threads()


def test_errors_reach_the_consumer(server: S3TestServer) -> None:
    server.put("b", "train/class_00/zz-corrupt.jpg", b"\xff\xd8\xff not a jpeg")
    try:
        with _loader(server, device="cpu", shuffle=False) as loader:
            with pytest.raises(al.DecodeError, match="zz-corrupt"):
                list(loader)
    finally:
        server.delete("b", "train/class_00/zz-corrupt.jpg")
    assert not _uploader_threads()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without CUDA")
def test_cuda_without_a_gpu_falls_back_to_cpu(
    server: S3TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncloader"):
        with _loader(server, device="cuda") as loader:
            assert loader.device == torch.device("cpu")
            images, _ = next(iter(loader))
    assert images.device.type == "cpu" and images.dtype == torch.float32
    assert "CUDA is not available" in caplog.text


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(
    ("mean", "std"),
    [(MEAN, STD), (None, None), ((0.5,), (0.25,)), ((0.1, 0.7, 0.3), (0.9, 0.05, 1.7))],
)
def test_the_gpu_form_of_the_conversion_rounds_as_the_cpu_form(
    dtype: str,
    channels_last: bool,
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
) -> None:
    """A GPU converts in two passes (mixed-dtype kernels), the CPU in same-dtype passes;
    run side by side here, the two forms give the same bits for every uint8 value."""
    spec = DeviceSpec.make("cpu", dtype, mean, std, channels_last)
    affine = spec.affine(3, torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (4, 3, 40, 24), dtype=torch.uint8, generator=gen)
    images[0, :, 0, :] = torch.arange(24, dtype=torch.uint8) * 11  # 0 and 253 among them
    images[0, :, 1, 0] = 255
    fused = spec.convert(images, affine, fused=True)
    plain = spec.convert(images, affine, fused=False)
    assert fused.dtype == plain.dtype == spec.dtype
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert fused.is_contiguous(memory_format=fmt) and plain.is_contiguous(memory_format=fmt)
    assert torch.equal(fused, plain)


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        DeviceSpec.make("cpu", "float64")
    with pytest.raises(ValueError, match="one value per channel"):
        DeviceSpec.make("cpu", mean=(0.5, 0.5), std=(0.5,))
    with pytest.raises(ValueError, match="must not contain 0"):
        DeviceSpec.make("cpu", std=(0.0, 1.0, 1.0))


class _Copy:
    """Stands for a copy's CUDA event: ``synchronize`` returns once the copy is "done"."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def synchronize(self) -> None:
        assert self.done.wait(10)


class _Slot:
    pass


def test_the_releaser_lets_a_slot_go_once_its_copy_is_done() -> None:
    """The uploader hands a source batch to the releaser and goes on; the batch (its ring
    slot) is let go when its copy's event completes, in order, and close waits for all."""
    releaser = _Releaser()
    copies = [_Copy() for _ in range(3)]
    slots = [_Slot() for _ in range(3)]
    gone = [weakref.ref(s) for s in slots]
    for copy, slot in zip(copies, slots, strict=True):
        releaser.hold(copy, slot)
    del slot, slots
    time.sleep(0.05)
    assert all(g() is not None for g in gone)  # nothing copied yet: every slot held
    copies[0].done.set()
    deadline = time.monotonic() + 10
    while gone[0]() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone[0]() is None and gone[1]() is not None and gone[2]() is not None
    copies[1].done.set()
    copies[2].done.set()
    releaser.close()
    assert all(g() is None for g in gone)


# --- CUDA: run where a GPU is lent -----------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("mode", ["process", "inline"])
@pytest.mark.parametrize("pin", ["register", "staging"])
@pytest.mark.parametrize(("dtype", "channels_last"), [("float32", False), ("float16", True)])
def test_cuda_is_bit_exact_with_the_cpu_path(
    server: S3TestServer, pin: str, dtype: str, channels_last: bool, mode: str
) -> None:
    """Both places of the engine (with engine processes the rings are shared memory the
    trainer maps, page-locked with cudaHostRegister under pin="register")."""
    kw = {"dtype": dtype, "engine": al.EngineConfig(mode=mode)}  # type: ignore[arg-type]
    layout = al.OutputConfig(channels_last=channels_last)
    with _loader(server, device="cpu", output=layout, **kw) as loader:
        cpu = _epoch(loader)
    pinned = dataclasses.replace(layout, pin=pin)
    with _loader(server, device="cuda", output=pinned, **kw) as loader:
        assert loader.device == torch.device("cuda", torch.cuda.current_device())
        loader.set_epoch(0)
        gpu = []
        for images, labels in loader:
            assert images.device.type == "cuda" and labels.device.type == "cuda"
            assert images.is_contiguous(
                memory_format=torch.channels_last if channels_last else torch.contiguous_format
            )
            gpu.append((images.cpu(), labels.cpu()))
    for (a, la), (b, lb) in zip(cpu, gpu, strict=True):
        assert torch.equal(la, lb)
        assert torch.equal(a, b), "GPU conversion differs from the CPU path"


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("mode", ["process", "inline"])
@pytest.mark.parametrize("pin", ["register", "staging"])
def test_cuda_slow_consumer_never_sees_a_reused_slot(
    server: S3TestServer, pin: str, mode: str
) -> None:
    """Two ring slots and a consumer slower than the producer: if a slot were refilled
    before its copy finished, a batch would carry pixels of a later one."""
    kw = {
        "engine": al.EngineConfig(prefetch_batches=2, mode=mode),  # type: ignore[arg-type]
        "fetch": al.FetchConfig(max_inflight=16),
        "labels": None,
    }
    with _loader(server, device="cpu", **kw) as loader:
        cpu = _epoch(loader)
    with _loader(server, device="cuda", output=al.OutputConfig(pin=pin), **kw) as loader:
        loader.set_epoch(0)
        for (images, _), (want, _) in zip(loader, cpu, strict=True):
            torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU work queued before reading
            time.sleep(0.05)
            assert torch.equal(images.cpu(), want)


@pytest.mark.cuda
@needs_cuda
def test_cuda_copies_overlap_compute(server: S3TestServer) -> None:
    """A CUDA-event timeline: while the training stream runs a step (and the host waits
    for its result, as a loop reading its loss does), the next batch is copied on the
    uploader's stream.  Only an epoch's first copy must precede every step of that epoch."""
    with _loader(server, device="cuda", batch_size=16) as loader:
        uploader = loader._uploader
        assert uploader is not None
        uploader.timeline = []
        stream = torch.cuda.current_stream()
        origin = torch.cuda.Event(enable_timing=True)
        origin.record(stream)
        kernels = []
        firsts = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            firsts.append(len(uploader.timeline))
            for images, _ in loader:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                torch.cuda._sleep(300_000_000)  # the "training step": ~0.15 s of GPU time
                images.float().mean().item()  # it reads the batch; the host waits for it
                end.record(stream)
                kernels.append((start, end))
        torch.cuda.synchronize()
        batches_per_epoch = len(loader)
        copies = [(origin.elapsed_time(a), origin.elapsed_time(b)) for a, b in uploader.timeline]
        steps = [(origin.elapsed_time(a), origin.elapsed_time(b)) for a, b in kernels]
    # Every batch's copy was recorded, each step really took GPU time, and the copies after
    # an epoch's first ran while a step was running (an empty or serial timeline fails).
    assert len(copies) == len(steps) == 2 * batches_per_epoch >= 8, (len(copies), len(steps))
    assert np.median([b - a for a, b in steps]) > 20, steps
    later = [c for i, c in enumerate(copies) if i not in firsts]
    overlapping = sum(any(c0 < k1 and k0 < c1 for k0, k1 in steps) for c0, c1 in later)
    assert overlapping >= len(later) * 3 // 4, (copies, steps)
