"""Decode JPEGs on the GPU, a batch at a time, straight into a ring slot on the device.

``ImageLoader(decode=DecodeConfig(backend="cuda"), device="cuda")``.  Per sample, a host
thread reads the bytes (fetched, or from the SSD cache), reads the JPEG's header, plans the
crop with the same transform and seed as the CPU path (so the same crop boxes and flips).
One GPU thread takes every sample that is ready (up to ``max_batch``), copies their bytes
into one pinned buffer, decodes them in one nvJPEG call (torchvision's batched
``decode_jpeg(device=...)``), and writes the crops, resized by Pillow's BILINEAR law and
flipped (the batch's crops gathered and resized together by batched matrix products,
``_gpu_batch`` and ``_resample``), rounded to uint8, into their samples of the device
ring's slot, on a CUDA stream of its own.  The samples' jobs complete once that
stream has finished: a slot is published only with all its pixels written, and the
pipeline's slot, order and release logic is the one every backend uses.

What nvJPEG is not given or refuses (not a JPEG, CMYK or YCCK, data it cannot decode) is
decoded by the CPU path (:func:`~._image.decode_into`) into host memory and copied into
the slot: the same crop box, the CPU's pixels.  What the CPU path refuses too is a
:class:`~asyncloader.DecodeError`, a counted skip under ``on_error="skip"``.

Every image the batch decoder returns is checked before it is resized: the header's size,
3 channels of uint8, and not black throughout.  One that fails (GPU decoders were seen to
report success for images they skipped) is decoded again by the CPU path, whose pixels
are delivered.  ``stats()`` counts each path: ``gpu_decoded`` (of which
``gpu_hardware`` by nvJPEG's hardware decoder, with the engines it reports in
``gpu_engines``: :mod:`._nvjpeg`), ``gpu_to_cpu`` (not given or refused) and
``gpu_suspect`` (failed the check).

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
import queue
import random
import threading
import time
from collections.abc import Sequence
from typing import cast

import torch

from .._base._errors import DecodeError, shown_key
from .._base._orientation import jpeg_turned
from .._base._types import Blob, CacheEvent, DecodeJob, DecodePath, Outcome
from ._completions import Completions, Group, Target
from ._gpu_batch import MAX_BATCH, DecodeBatch, GpuBatcher, GpuWork, drain_stream
from ._image import DecodeSpec
from ._job import job_bytes
from ._ship import jpeg_header

__all__ = ["GpuDecodePool"]


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
        self._spec = dataclasses.replace(spec, scaled_copies=False)
        self._images = images
        self._batcher = GpuBatcher(self._spec, self.device, decode_batch)
        self._max_batch = max_batch
        self._host: queue.SimpleQueue[tuple[Target, DecodeJob] | None] = queue.SimpleQueue()
        self._gpu: queue.SimpleQueue[GpuWork | None] = queue.SimpleQueue()
        self._results = Completions()
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

    @property
    def batches(self) -> int:
        """Decode calls made."""
        return self._batcher.batches

    @property
    def on_cpu(self) -> int:
        """Samples the CPU path decoded."""
        return self._batcher.on_cpu

    @property
    def engines(self) -> int | None:
        """The hardware JPEG engines nvJPEG reports (:attr:`GpuBatcher.engines`)."""
        return self._batcher.engines

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
    ) -> GpuWork:
        spec = self._spec
        work = GpuWork(target, job, data, events, 0.0)
        header = jpeg_header(data)
        nvjpeg = header is not None and header[2] in (1, 3)  # grey or YCbCr (not CMYK)
        if nvjpeg and spec.exif_orientation and jpeg_turned(data):
            nvjpeg = False  # turned upright on the CPU
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
            work.host = self._batcher.on_cpu_path(work)
            work.path = DecodePath.GPU_TO_CPU
        return work

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
                    results = self._batcher.run(batch, self._images)
                    drain_stream(self.device)  # waited for asleep, not spinning
            except BaseException as exc:  # a CUDA error: every sample of the batch fails
                results = [exc] * len(batch)
            share = (time.perf_counter() - t0) / len(batch)
            self._complete(
                [
                    (
                        cast(Target, w.target),
                        r if r is not None else Outcome(w.busy + share, w.events, w.path),
                    )
                    for w, r in zip(batch, results, strict=True)
                ]
            )
            del batch, first, results
            if stop:
                break
