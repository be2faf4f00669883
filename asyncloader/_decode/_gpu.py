"""Decode JPEGs on the GPU, a batch at a time, straight into a ring slot on the device.

``ImageLoader(decode=DecodeConfig(backend="cuda"), device="cuda")``.  Per sample, a host
thread reads the bytes (fetched, or from the SSD cache), reads the JPEG's header, plans the
crop with the same transform and seed as the CPU path (so the same crop boxes and flips),
and works out the resize's filter weights: Pillow's BILINEAR law (``_resample``), the flip
folded in.  One GPU thread takes every sample that is ready (up to ``max_batch``), copies
their bytes into one pinned buffer, decodes them in one nvJPEG call (torchvision's batched
``decode_jpeg(device=...)``), and writes each crop, resized and flipped (two small matrix
products with the weights, ``_resample``), rounded to uint8, into its sample of the
device ring's slot, on a CUDA stream of its own.  The samples' jobs complete once that
stream has finished: a slot is published only with all its pixels written, and the
pipeline's slot, order and release logic is the one every backend uses.

What nvJPEG is not given or refuses (not a JPEG, CMYK or YCCK, data it cannot decode) is
decoded by the CPU path (:func:`~._image.decode_into`) into host memory and copied into
the slot: the same crop box, the CPU's pixels.  What the CPU path refuses too is a
:class:`~asyncloader.DecodeError`, a counted skip under ``on_error="skip"``.

Every image the batch decoder returns is checked before it is resized: the header's size,
3 channels of uint8, and not black throughout.  One that fails (GPU decoders were seen to
report success for images they skipped) is decoded again by the CPU path, whose pixels
are delivered.  ``stats()`` counts each path: ``gpu_decoded``, ``gpu_to_cpu`` (not given
or refused) and ``gpu_suspect`` (failed the check).

The pixels are close to the CPU path's, not equal: the GPU decodes the whole image where
the CPU path decodes at 1/2, 1/4 or 1/8 scale when the crop allows (libjpeg's DCT
scaling), nvJPEG upsamples chroma its own way, and the resize runs in float32 without
Pillow's rounding between its two passes (the tolerance is measured and tested on a GPU).
Scaled copies in the cache are not read: they are meant for a DCT-scaled decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .._base._errors import DecodeError, shown_key
from .._base._types import Blob, CacheEvent, DecodeJob, DecodePath, Outcome
from ._completions import Completions, Group, Target
from ._image import DecodeSpec, decode_into
from ._job import job_bytes
from ._resample import jpeg_header, resample, weights, windows

__all__ = ["DecodeBatch", "GpuDecodePool", "nvjpeg_batch", "require_torchvision"]

DecodeBatch = Callable[[list[torch.Tensor]], list[torch.Tensor | BaseException]]
"""Encoded JPEGs (uint8 CPU tensors) → each one's RGB pixels [3, H, W] uint8 on the
pool's device, or the exception that refused it."""

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
class _Work:
    """One sample between its host thread and the GPU thread."""

    target: Target
    job: DecodeJob
    data: Blob | memoryview
    events: CacheEvent
    busy: float  # host time spent on it so far [s]
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # the crop, source pixels
    source: tuple[int, int] = (0, 0)  # the image's width and height
    flip: bool = False
    host: npt.NDArray[np.uint8] | None = None  # decoded on the CPU (not for nvJPEG)
    path: DecodePath = DecodePath.GPU  # where it was decoded (stats() counts them)


# Most elements of one group's weights (float64 while they are made): 128 MiB.
_WEIGHTS_MAX = 1 << 24


class GpuDecodePool:
    """Decode JPEGs on ``images``' device into its slots (see the module's docstring).

    Args:
        workers: Host threads: cache reads, headers, plans, weights, and the CPU decode of
            what nvJPEG is not given.
        spec: What every decode needs (the transform; no ``decode_fn``).
        images: The device ring's images, uint8 [slots, batch, 3, H, W].
        decode_batch: The batch decoder (default: :func:`nvjpeg_batch` on the device).
        max_batch: The most samples one decode call takes.
    """

    def __init__(
        self,
        workers: int,
        spec: DecodeSpec,
        images: torch.Tensor,
        *,
        decode_batch: DecodeBatch | None = None,
        max_batch: int = MAX_BATCH,
    ) -> None:
        if spec.decode_fn is not None or spec.transform is None:
            raise ValueError("decoding on the GPU needs a transform and no decode= hook")
        self.workers = workers
        self.device = images.device
        self.batches = 0  # decode calls made
        self.on_cpu = 0  # samples the CPU path decoded
        self._spec = dataclasses.replace(spec, scaled_copies=False)
        self._images = images
        self._decode_batch = decode_batch or nvjpeg_batch(self.device)
        self._max_batch = max_batch
        self._host: queue.SimpleQueue[tuple[Target, DecodeJob] | None] = queue.SimpleQueue()
        self._gpu: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._results = Completions()
        self._pinned: torch.Tensor | None = None
        # Daemon: aclose() stops and joins them (the runtime's teardown, bounded); one stuck
        # in a decode or a CUDA call past that bound must not hang interpreter exit.
        self._threads = [
            threading.Thread(target=self._host_work, name=f"asyncloader-gpu-host-{i}", daemon=True)
            for i in range(workers)
        ]
        self._threads.append(
            threading.Thread(target=self._gpu_work, name="asyncloader-gpu-decode", daemon=True)
        )
        for t in self._threads:
            t.start()

    # --- the loop's side ----------------------------------------------------------------

    async def decode(self, job: DecodeJob, priority: int = 0) -> Outcome:
        fut = self._results.future()
        self._queue([(fut, job)])
        return await fut  # type: ignore[no-any-return]

    async def decode_many(
        self, jobs: Sequence[DecodeJob], priority: int = 0
    ) -> list[Outcome | BaseException]:
        """The jobs of a batch as one group: one future for all of them."""
        if not jobs:
            return []
        group = Group(self._results.future(), len(jobs))
        self._queue([((group, i), job) for i, job in enumerate(jobs)])
        return await group.fut

    def _queue(self, items: list[tuple[Target, DecodeJob]]) -> None:
        with self._results.lock:
            self._results.started(len(items))
        for item in items:
            self._host.put(item)

    def _complete(self, items: list[tuple[Target, Outcome | BaseException]]) -> None:
        self._results.finish(items, more_queued=False)

    async def drain(self) -> None:
        """Wait until no job is queued or running: only then can slots be reused."""
        await self._results.drain()

    async def aclose(self) -> None:
        """Stop the threads once their current work is done (joined off the loop)."""
        for _ in range(self.workers):
            self._host.put(None)
        try:
            await asyncio.to_thread(self._join)
        except RuntimeError:  # interpreter exit: no new threads may start any more
            self._join()
        self._results.deliver()

    def _join(self) -> None:
        for t in self._threads[:-1]:
            t.join()
        self._gpu.put(None)
        self._threads[-1].join()

    # --- host threads ---------------------------------------------------------------------

    def _host_work(self) -> None:
        try:
            while (item := self._host.get()) is not None:
                target, job = item
                t0 = time.perf_counter()
                try:
                    data, events = job_bytes(job, self._spec)
                    if data is None:  # evicted since the index query: the loop fetches it
                        self._complete([(target, Outcome(time.perf_counter() - t0, events))])
                        continue
                    work = self._plan(target, job, data, events)
                    work.busy = time.perf_counter() - t0
                    self._gpu.put(work)
                except BaseException as exc:
                    self._complete([(target, exc)])
                del item, target, job
        finally:
            if self._spec.cache is not None:
                self._spec.cache.close()  # this thread's index connection

    def _plan(
        self,
        target: Target,
        job: DecodeJob,
        data: Blob | memoryview,
        events: CacheEvent,
    ) -> _Work:
        spec = self._spec
        work = _Work(target, job, data, events, 0.0)
        header = jpeg_header(data)
        nvjpeg = header is not None and header[2] in (1, 3)  # grey or YCbCr (not CMYK)
        if nvjpeg:
            assert header is not None
            width, height, _ = header
            if width * height > spec.max_pixels:
                raise DecodeError(
                    f"{shown_key(job.key)} is {width}x{height} pixels, over "
                    f"max_pixels={spec.max_pixels} (decompression bomb?)",
                    key=job.key,
                )
            assert spec.transform is not None
            plan = spec.transform.plan(width, height, random.Random(job.seed))
            work.box, work.source, work.flip = plan.box, (width, height), plan.flip
        else:
            work.host = self._on_cpu(work)
            work.path = DecodePath.GPU_TO_CPU
        return work

    def _on_cpu(self, work: _Work) -> npt.NDArray[np.uint8]:
        """The CPU path's pixels for ``work`` (raises DecodeError where it refuses)."""
        out = np.empty(self._spec.sample_shape, np.uint8)
        decode_into(work.data, out, self._spec, work.job.seed, work.job.key)
        self.on_cpu += 1
        return out

    # --- the GPU thread -------------------------------------------------------------------

    def _gpu_work(self) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)
        stream = torch.cuda.Stream(self.device) if cuda else None  # type: ignore[no-untyped-call]
        while (first := self._gpu.get()) is not None:
            batch = [first]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    more = self._gpu.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            t0 = time.perf_counter()
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    results = self._run_batch(batch)
                    if stream is not None:
                        stream.synchronize()
            except BaseException as exc:  # a CUDA error: every sample of the batch fails
                results = [exc] * len(batch)
            share = (time.perf_counter() - t0) / len(batch)
            self._complete(
                [
                    (w.target, r if r is not None else Outcome(w.busy + share, w.events, w.path))
                    for w, r in zip(batch, results, strict=True)
                ]
            )
            del batch, first, results
            if stop:
                break

    def _staging(self, nbytes: int) -> torch.Tensor:
        """A host buffer of at least ``nbytes`` (page-locked on a GPU), reused: each batch
        is finished before the next one is staged."""
        if self._pinned is None or self._pinned.numel() < nbytes:
            size = 1 << max(20, math.ceil(math.log2(max(nbytes, 1))))
            buf = torch.empty(size, dtype=torch.uint8)
            self._pinned = buf.pin_memory() if self.device.type == "cuda" else buf
        return self._pinned

    def _run_batch(self, batch: list[_Work]) -> list[BaseException | None]:
        """Decode ``batch`` into the ring; each sample's failure, or None."""
        results: list[BaseException | None] = [None] * len(batch)
        jpegs = [i for i, w in enumerate(batch) if w.host is None]
        if jpegs:
            self.batches += 1
            # The bytes in one page-locked buffer, read by nvJPEG from there.
            sizes = [len(batch[i].data) for i in jpegs]
            buf = self._staging(sum(sizes))
            host = buf.numpy()
            inputs = []
            at = 0
            for i, n in zip(jpegs, sizes, strict=True):
                host[at : at + n] = np.frombuffer(batch[i].data, np.uint8)
                inputs.append(buf[at : at + n])
                at += n
            decoded = self._decode_batch(inputs)
            ok: list[tuple[int, torch.Tensor]] = []
            for i, image in zip(jpegs, decoded, strict=True):
                if isinstance(image, BaseException):  # what nvJPEG refused
                    results[i] = self._redo_on_cpu(batch[i], DecodePath.GPU_TO_CPU)
                else:
                    ok.append((i, image))
            suspect = self._suspects(batch, ok)
            for i in suspect:
                results[i] = self._redo_on_cpu(batch[i], DecodePath.GPU_SUSPECT)
            ok = [(i, image) for i, image in ok if i not in suspect]
            if ok:
                self._resize([batch[i] for i, _ in ok], [image for _, image in ok])
        for i, w in enumerate(batch):
            if w.host is not None and results[i] is None:
                self._images[w.job.slot, w.job.index].copy_(torch.from_numpy(w.host))
        return results

    def _redo_on_cpu(self, work: _Work, path: DecodePath) -> BaseException | None:
        """Decode ``work`` on the CPU instead (``path`` says why); its failure, or None."""
        work.path = path
        try:
            work.host = self._on_cpu(work)
        except BaseException as exc:
            return exc
        return None

    def _suspects(self, batch: list[_Work], ok: list[tuple[int, torch.Tensor]]) -> set[int]:
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
            peaks = torch.stack([image.amax() for _, image in sized]).cpu().tolist()
            out.update(i for (i, _), peak in zip(sized, peaks, strict=True) if peak == 0)
        return out

    def _resize(self, works: list[_Work], images: list[torch.Tensor]) -> None:
        """Crop, resize and flip each decoded image into its sample of the ring: the
        weights made on the device for a group of images at once."""
        _, out_h, out_w = self._spec.sample_shape
        box = np.array([w.box for w in works], np.float64)
        src = np.array([w.source for w in works], np.float64)
        win_x = windows(box[:, 0], box[:, 2], src[:, 0], out_w)
        win_y = windows(box[:, 1], box[:, 3], src[:, 1], out_h)
        x0, nx = (
            win_x[1].min(axis=1).astype(int),
            (win_x[2].max(axis=1) - win_x[1].min(axis=1)).astype(int),
        )
        y0, ny = (
            win_y[1].min(axis=1).astype(int),
            (win_y[2].max(axis=1) - win_y[1].min(axis=1)).astype(int),
        )
        flips = torch.tensor([w.flip for w in works], device=self.device)
        start = 0
        while start < len(works):
            # A group: as many images as keep its weights under _WEIGHTS_MAX elements.
            end, kx, ky = start, 0, 0
            while end < len(works):
                kx2, ky2 = max(kx, nx[end]), max(ky, ny[end])
                if end > start and (end + 1 - start) * (out_w * kx2 + out_h * ky2) > _WEIGHTS_MAX:
                    break
                kx, ky, end = kx2, ky2, end + 1
            part = slice(start, end)
            wx = weights(self._to_device(win_x[:, part]), int(kx), flips[part])
            wy = weights(self._to_device(win_y[:, part]), int(ky))
            outs = torch.stack(
                [
                    resample(
                        images[j],
                        wx[j - start, :, : nx[j]],
                        int(x0[j]),
                        wy[j - start, :, : ny[j]],
                        int(y0[j]),
                    )
                    for j in range(start, end)
                ]
            )
            slots = self._to_device(np.array([w.job.slot for w in works[part]]))
            index = self._to_device(np.array([w.job.index for w in works[part]]))
            self._images[slots, index] = outs.round_().clamp_(0, 255).to(torch.uint8)
            start = end

    def _to_device(self, array: npt.NDArray[Any]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
