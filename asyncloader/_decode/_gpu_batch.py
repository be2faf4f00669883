"""GPU decode's batch: one batched nvJPEG call, every image checked, one crop-resize.

The GPU side of both ways GPU decode runs (``DecodeConfig(backend="cuda")``): the pool of
the engine in the training process (:mod:`._gpu`), and the training process's half where
the engine runs in processes of its own and ships each batch's JPEGs and crop plans
(:mod:`._ship`).  :class:`GpuBatcher` copies a batch's bytes into one page-locked buffer,
decodes them in one call (torchvision's batched ``decode_jpeg(device=...)``), checks each
image (the header's size, 3 channels of uint8, not black throughout), and crops, resizes and
flips the good ones by matrix products (``_resample``) into their places; what nvJPEG
refuses or what fails the check is decoded again by the CPU path
(:func:`~._image.decode_into`), whose pixels are delivered.  The stream is drained before
each decode call: nvJPEG writes on a stream of its own, not ordered against the caller's,
into memory the caller's queued work may still use (torchvision's ``decode_jpeg`` gave
corrupt batches on H100s so).

:class:`ShipUnpacker` is the training process's half of a shipped batch: a
:class:`~asyncloader._base._types.Shipped` slot in, the batch on the GPU out, on the
loader's own CUDA stream, waited for with a blocking event (the training process sleeps,
it does not spin), the slot let go as soon as its bytes were read.  The engine's CPU-path
samples are copied from the slot's pixels.  A sample that neither the GPU nor the CPU path
decodes is left out of its batch under ``on_error="skip"`` (counted in ``stats()``), and
raised otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .._base._errors import shown_key
from .._base._stats import Counters
from .._base._types import Blob, CacheEvent, DecodeJob, DecodePath, Shipped
from ._completions import Target
from ._image import DecodeSpec, decode_into
from ._nvjpeg import HardwareProbe, NvjpegProbe
from ._resample import crops, resample, spans, weights, windows

__all__ = [
    "MAX_BATCH",
    "DecodeBatch",
    "GpuBatcher",
    "GpuWork",
    "ShipUnpacker",
    "drain_stream",
    "nvjpeg_batch",
    "require_torchvision",
]

DecodeBatch = Callable[[list[torch.Tensor]], list[torch.Tensor | BaseException]]
"""Encoded JPEGs (uint8 CPU tensors) → each one's RGB pixels [3, H, W] uint8 on the
batcher's device, or the exception that refused it."""

MAX_BATCH = 256
"""The most samples one nvJPEG call decodes."""


def require_torchvision() -> None:
    """Raise a clear ImportError where torchvision (its nvJPEG decoder) is missing."""
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "DecodeConfig(backend='cuda') decodes with torchvision's nvJPEG decoder: "
            "pip install torchvision (the build that matches your torch)"
        ) from exc


def nvjpeg_batch(device: torch.device) -> DecodeBatch:
    """torchvision's batched nvJPEG decode on ``device``; a batch it refuses is decoded one
    by one, so that one bad sample costs only itself."""
    require_torchvision()
    from torchvision.io import ImageReadMode, decode_jpeg

    def run(data: list[torch.Tensor]) -> list[torch.Tensor | BaseException]:
        try:
            return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            out: list[torch.Tensor | BaseException] = []
            for one in data:
                try:
                    out.append(decode_jpeg(one, mode=ImageReadMode.RGB, device=device))
                except RuntimeError as exc:
                    out.append(exc)
            return out

    return run


@dataclass(slots=True)
class GpuWork:
    """One sample of a GPU batch (in the pool: between its host thread and the GPU
    thread)."""

    target: Target | None  # its job's future (the pool), or None (a shipped batch)
    job: DecodeJob
    data: Blob | memoryview | None  # None: ``host`` holds its pixels
    events: CacheEvent
    busy: float  # host time spent on it so far [s]
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # the crop, source pixels
    source: tuple[int, int] = (0, 0)  # the image's width and height
    flip: bool = False
    host: npt.NDArray[np.uint8] | None = None  # decoded on the CPU (not for nvJPEG)
    path: DecodePath = DecodePath.GPU  # where it was decoded (stats() counts them)


# Most elements of one group's weights (float64 while they are made): 128 MiB.
_WEIGHTS_MAX = 1 << 24
# Most source pixels of one group's padded crops: 8 Mi, 64 MiB of gather indices and
# 96 MiB of float32 crops.
_CROP_MAX = 1 << 23


class GpuBatcher:
    """A batch of JPEGs decoded on ``device`` into their places (see the module's
    docstring); one batch at a time, from one thread.

    Args:
        spec: What every decode needs (the transform, the CPU path's limits).
        device: Where the images are decoded and resized.
        decode_batch: The batch decoder (default: :func:`nvjpeg_batch` on ``device``).
        probe: Which images the decoder's hardware decodes (default: with nvJPEG, a
            :class:`~._nvjpeg.NvjpegProbe` opened after the first batch; else none).

    Attributes:
        batches: Decode calls made.
        on_cpu: Samples the CPU path decoded.
        engines: The hardware JPEG engines nvJPEG reports (see :mod:`._nvjpeg`), once the
            first batch was decoded with nvJPEG; None before, with another batch decoder,
            or where nvJPEG could not be asked.
    """

    def __init__(
        self,
        spec: DecodeSpec,
        device: torch.device,
        decode_batch: DecodeBatch | None = None,
        probe: HardwareProbe | None = None,
    ) -> None:
        self.device = device
        self.batches = 0
        self.on_cpu = 0
        self._spec = spec
        self._decode_batch = decode_batch or nvjpeg_batch(device)
        # nvJPEG's is asked after its first call (torchvision's library loaded by then).
        self.engines: int | None = None
        self._probe: HardwareProbe | None = None
        self._use(probe)
        self._ask = decode_batch is None and probe is None
        self._pinned: torch.Tensor | None = None

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample."""
        return self._spec.sample_shape

    def on_cpu_path(self, work: GpuWork) -> npt.NDArray[np.uint8]:
        """The CPU path's pixels for ``work`` (raises DecodeError where it refuses)."""
        assert work.data is not None
        out = np.empty(self._spec.sample_shape, np.uint8)
        decode_into(work.data, out, self._spec, work.job.seed, work.job.key)
        self.on_cpu += 1
        return out

    def _staging(self, nbytes: int) -> torch.Tensor:
        """A host buffer of at least ``nbytes`` (page-locked on a GPU), reused: each batch
        is finished before the next one is staged."""
        if self._pinned is None or self._pinned.numel() < nbytes:
            size = 1 << max(20, math.ceil(math.log2(max(nbytes, 1))))
            buf = torch.empty(size, dtype=torch.uint8)
            self._pinned = buf.pin_memory() if self.device.type == "cuda" else buf
        return self._pinned

    def stage(self, data: list[Blob | memoryview | None]) -> list[torch.Tensor]:
        """The JPEGs ``data`` in one page-locked buffer (nvJPEG reads them from there), as
        views of it, one a JPEG; the buffer is reused by the next batch."""
        sizes = [len(d) if d is not None else 0 for d in data]
        total = sum(sizes)
        buf = self._staging(total)
        host = buf.numpy()
        at = 0
        for d, n in zip(data, sizes, strict=True):
            assert d is not None  # given to the GPU: its bytes
            host[at : at + n] = np.frombuffer(d, np.uint8)
            at += n
        return list(torch.split(buf[:total], sizes))  # the views in one call

    def run(self, batch: list[GpuWork], images: torch.Tensor) -> list[BaseException | None]:
        """Decode ``batch`` into ``images`` (uint8 [slots, batch, 3, H, W] on the device:
        each sample at its job's slot and index); each sample's failure, or None.  Queued
        on the current stream; the caller waits for it."""
        results: list[BaseException | None] = [None] * len(batch)
        jpegs = [i for i, w in enumerate(batch) if w.host is None]
        if jpegs:
            self.batches += 1
            inputs = self.stage([batch[i].data for i in jpegs])
            # nvJPEG writes its images on a stream of its own, into memory allocated on
            # this one: work still queued here on memory freed to the allocator would meet
            # them (corrupt batches on H100s, torchvision's decode_jpeg included).  Drained
            # first, asleep.
            drain_stream(self.device)
            decoded = self._decode_batch(inputs)
            if self._ask:
                self._ask = False
                self._use(NvjpegProbe.open(self.device))
            ok: list[tuple[int, torch.Tensor]] = []
            for i, data, image in zip(jpegs, inputs, decoded, strict=True):
                if isinstance(image, BaseException):  # what nvJPEG refused
                    results[i] = self._redo_on_cpu(batch[i], DecodePath.GPU_TO_CPU)
                else:
                    ok.append((i, image))
                    if self._probe is not None and self._probe.takes(data):
                        batch[i].path = DecodePath.GPU_HARDWARE
            suspect = self._suspects(batch, ok)
            for i in suspect:
                results[i] = self._redo_on_cpu(batch[i], DecodePath.GPU_SUSPECT)
            ok = [(i, image) for i, image in ok if i not in suspect]
            if ok:
                self._resize([batch[i] for i, _ in ok], [image for _, image in ok], images)
        for i, w in enumerate(batch):
            if w.host is not None and results[i] is None:
                images[w.job.slot, w.job.index].copy_(torch.from_numpy(w.host))
        return results

    def _use(self, probe: HardwareProbe | None) -> None:
        """Take ``probe``'s engines; ask it about each image only where there are some."""
        self.engines = probe.engines if probe is not None else None
        self._probe = probe if self.engines else None

    def _redo_on_cpu(self, work: GpuWork, path: DecodePath) -> BaseException | None:
        """Decode ``work`` on the CPU instead (``path`` says why); its failure, or None."""
        work.path = path
        try:
            work.host = self.on_cpu_path(work)
        except BaseException as exc:
            return exc
        return None

    def _suspects(self, batch: list[GpuWork], ok: list[tuple[int, torch.Tensor]]) -> set[int]:
        """The images the decoder says it decoded that fail the check: not the header's
        size as 3 channels of uint8, or black throughout (no pixel above 0).  GPU decoders
        of 2026 were seen to report success for images they skipped (black images from
        Blackwell's hardware decoder, zero-filled lossless JPEGs); a truly black image
        costs a second decode on the CPU, which delivers the same black.  One wait for the
        decoder's work per batch: the peaks come back together."""
        out: set[int] = set()
        sized: list[tuple[int, torch.Tensor]] = []
        for i, image in ok:
            width, height = batch[i].source
            if image.dtype != torch.uint8 or tuple(image.shape) != (3, height, width):
                out.add(i)
            else:
                sized.append((i, image))
        if sized:
            stacked = torch.stack(_peaks([image for _, image in sized]))
            drain_stream(self.device)  # asleep: a copy's own wait may spin a core
            peaks = stacked.cpu().tolist()
            out.update(i for (i, _), peak in zip(sized, peaks, strict=True) if peak == 0)
        return out

    def _resize(
        self, works: list[GpuWork], decoded: list[torch.Tensor], images: torch.Tensor
    ) -> None:
        """Crop, resize and flip the decoded images into their samples of the ring, a
        group of images at a time: one gather of their crops, the weights made on the
        device, two batched matrix products, one scatter (``_resample``).  The images
        are grouped smallest crop first, so that a group's padding (to its largest crop)
        stays small."""
        _, out_h, out_w = self._spec.sample_shape
        box = np.array([w.box for w in works], np.float64)
        src = np.array([w.source for w in works], np.float64)
        win_x = windows(box[:, 0], box[:, 2], src[:, 0], out_w)
        win_y = windows(box[:, 1], box[:, 3], src[:, 1], out_h)
        (x0, nx), (y0, ny) = spans(win_x), spans(win_y)
        width, height = src[:, 0].astype(np.int64), src[:, 1].astype(np.int64)
        # Every image's planes one after another (each checked [3, height, width]): one copy.
        flat = torch.cat([image.reshape(3, -1) for image in decoded], dim=1)
        base = np.cumsum(width * height) - width * height
        slot, index = [w.job.slot for w in works], [w.job.index for w in works]
        flips = [w.flip for w in works]
        place = np.array([base, width, height, x0, y0, slot, index, flips], np.float64)
        for part in _groups(nx, ny, out_w, out_h):
            kx, ky = int(nx[part].max()), int(ny[part].max())
            # The group's windows and places in one copy to the device (float64 holds
            # every integer here exactly).
            host = [win_x[:, part], win_y[:, part], place[:, part]]
            sent = torch.from_numpy(np.concatenate([a.ravel() for a in host])).to(self.device)
            wxs, wys, at = torch.split(sent, [a.size for a in host])
            at = at.view(8, len(part)).long()
            wx = weights(wxs.view(4, len(part), out_w), kx, at[7].bool())
            wy = weights(wys.view(4, len(part), out_h), ky)
            out = resample(crops(flat, at[:5], kx, ky), wx, wy)
            images[at[5], at[6]] = out.round_().clamp_(0, 255).to(torch.uint8)


class ShipUnpacker:
    """The training process's half of GPU decode with engine processes (see the module's
    docstring): a shipped batch in, ``(images, labels, meta)`` on the device out.

    Args:
        spec: The loader's decode spec (the plans, the CPU path where it takes over).
        device: Where the batch is decoded.
        counters: The training process's counters (where each sample was decoded, skips).
        skip: ``on_error="skip"``: a sample that neither the GPU nor the CPU path decodes is
            left out of its batch; else its :class:`~asyncloader.DecodeError` is raised.
        decode_batch: The batch decoder (default: :func:`nvjpeg_batch` on ``device``).
        probe: Which images the decoder's hardware decodes (see :class:`GpuBatcher`).
    """

    def __init__(
        self,
        spec: DecodeSpec,
        device: torch.device,
        counters: Counters,
        *,
        skip: bool,
        decode_batch: DecodeBatch | None = None,
        probe: HardwareProbe | None = None,
    ) -> None:
        spec = dataclasses.replace(spec, cache=None, scaled_copies=False)
        self._batcher = GpuBatcher(spec, device, decode_batch, probe)
        self._counters = counters
        self._skip = skip
        self._stream: Any = None

    def __call__(
        self, shipped: Shipped, labels: torch.Tensor, meta: tuple[int, int, dict[str, list[Any]]]
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, dict[str, list[Any]]]]:
        """The batch of ``shipped`` on the device, finished; ``labels`` and ``meta``
        (index, count, extras) as delivered (without the samples left out)."""
        device = self._batcher.device
        works = _works(shipped)
        # The slot goes back once the work no longer holds its bytes: nothing returned
        # views it.
        del shipped
        labels = labels.clone()
        if device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        stream = self._stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            shape = (1, len(works), *self._batcher.sample_shape)
            images = torch.empty(shape, dtype=torch.uint8, device=device)
            results = self._batcher.run(works, images)
            c = self._counters
            for w, res in zip(works, results, strict=True):
                if w.data is not None and res is None:
                    c.count_path(w.path)
            c.gpu_engines = self._batcher.engines
            out = images[0]
            failed = [i for i, res in enumerate(results) if res is not None]
            if failed:
                out, labels, meta = self._leave_out(works, results, failed, out, labels, meta)
            drain_stream(device)  # asleep: the training process does not spin
        return out, labels, meta

    def _leave_out(
        self,
        works: list[GpuWork],
        results: list[BaseException | None],
        failed: list[int],
        images: torch.Tensor,
        labels: torch.Tensor,
        meta: tuple[int, int, dict[str, list[Any]]],
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, dict[str, list[Any]]]]:
        """The batch without the samples ``failed`` (skipped, counted), or the first
        failure raised."""
        errors = [results[i] for i in failed]
        if not self._skip:
            raise errors[0]  # type: ignore[misc]
        gone = set(failed)
        keep = [i for i in range(len(works)) if i not in gone]
        self._counters.count_skipped(
            Counter(type(exc).__name__ for exc in errors),
            [shown_key(works[i].job.key) for i in failed],
        )
        index, _, extras = meta
        at = torch.tensor(keep, dtype=torch.int64)
        return (
            images.index_select(0, at.to(images.device)),
            labels.index_select(0, at),
            (index, len(keep), {name: [v[i] for i in keep] for name, v in extras.items()}),
        )


def _works(shipped: Shipped) -> list[GpuWork]:
    """A shipped batch's samples as GPU work: a shipped JPEG's bytes (views of its slot's
    arena) and plan, or the pixels its engine decoded."""
    r = shipped.records
    flags, offsets, lengths, keys = (
        r["shipped"].tolist(),
        r["offset"].tolist(),
        r["length"].tolist(),
        r["key_length"].tolist(),
    )
    widths, heights, seeds, flips, boxes = (
        r["width"].tolist(),
        r["height"].tolist(),
        r["seed"].tolist(),
        r["flip"].tolist(),
        r["box"].tolist(),
    )
    arena = shipped.arena
    works = []
    for i, shipped_here in enumerate(flags):
        if not shipped_here:
            job = DecodeJob(None, 0, i, seeds[i], "")
            works.append(GpuWork(None, job, None, CacheEvent.NONE, 0.0, host=shipped.pixels[i]))
            continue
        at, n = offsets[i], lengths[i]
        key = bytes(arena[at + n : at + n + keys[i]]).decode(errors="replace")
        job = DecodeJob(None, 0, i, seeds[i], key)
        works.append(
            GpuWork(
                None,
                job,
                arena[at : at + n].data,
                CacheEvent.NONE,
                0.0,
                tuple(boxes[i]),  # type: ignore[arg-type]
                (widths[i], heights[i]),
                bool(flips[i]),
            )
        )
    return works


def _groups(
    nx: npt.NDArray[np.int64], ny: npt.NDArray[np.int64], out_w: int, out_h: int
) -> list[npt.NDArray[np.intp]]:
    """The images (by their spans' sizes, ``nx`` × ``ny`` source pixels) in groups resized
    together: smallest crop first, each group as many images as keep its weights under
    :data:`_WEIGHTS_MAX` elements and its padded crops under :data:`_CROP_MAX` pixels
    (one image at least)."""
    order = np.argsort(nx * ny, kind="stable")
    groups = []
    start = 0
    while start < len(order):
        end, kx, ky = start, 0, 0
        while end < len(order):
            kx2, ky2 = max(kx, int(nx[order[end]])), max(ky, int(ny[order[end]]))
            n = end + 1 - start
            if end > start and (
                n * (out_w * kx2 + out_h * ky2) > _WEIGHTS_MAX or n * kx2 * ky2 > _CROP_MAX
            ):
                break
            kx, ky, end = kx2, ky2, end + 1
        groups.append(order[start:end])
        start = end
    return groups


def _peaks(images: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each image's largest value: one fused kernel for the list where torch has one
    (``_foreach_max``), else one reduction an image."""
    foreach_max = getattr(torch, "_foreach_max", None)
    if foreach_max is not None:
        try:
            return list(foreach_max(images))
        except (RuntimeError, NotImplementedError):  # a dtype or device it does not take
            pass
    return [image.amax() for image in images]


def drain_stream(device: torch.device) -> None:
    """Wait, asleep, until the work queued so far on the current stream is done (a
    blocking event: CUDA's own waits may spin a core); nothing to wait for on the CPU."""
    if device.type == "cuda":
        done = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
        done.record()
        done.synchronize()
