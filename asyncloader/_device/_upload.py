"""The last stage: batches handed to training already on their device, converted and normalised.

A thread drains the loader's batch stream and keeps up to ``depth`` finished batches ahead of
the training loop:

* **CUDA**: the ring slot (page-locked by registering the ring with the CUDA runtime, or
  else copied into one of a few pinned staging buffers) is copied with ``non_blocking=True``
  on a dedicated copy stream, then converted uint8 → float and normalised on a second stream
  that waits on the copy's event, so the next batch's copy runs while this one is converted.
  The thread never waits for a copy: a releaser thread holds each slot until its copy's
  event has completed, then lets it go back to the ring.  A second event marks the batch
  ready; the consumer's stream waits on it (no host sync) and the tensors are recorded on
  that stream so the caching allocator does not reuse them early.
* **CPU** (``device="cpu"``, or no GPU): the same conversion with the same arithmetic, so code
  and tests run everywhere and results match the GPU's bit for bit.  Batches are made in
  reused buffers, each written again only once the last reference to the batch made in it
  is gone (as ring slots are); when the consumer still holds every buffer a new one is made,
  so kept batches cost memory like fresh tensors, never other pixels.  GPU batches are fresh
  tensors from the caching allocator.

The uploader lets go of each ring slot as soon as its copy is done (on CUDA with the ring
page-locked: once the copy's event has completed; with staging: once the slot is staged).

What the batches become (device, dtype, normalisation, layout) is a
:class:`~asyncloader._device._device_spec.DeviceSpec`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from .._base._errors import AsyncLoaderError, PipelineDeadError
from .._base._lease import Lease, leased
from ._device_spec import DeviceSpec

__all__ = ["Uploader"]

log = logging.getLogger("asyncloader")

_SLICE = 0.1


# (images uint8 [B,C,H,W] CPU view, labels int64 [B] CPU view, meta): a batch as the loader
# produces it; the views hold their ring slot until the uploader drops them.
SourceBatch = tuple[torch.Tensor, torch.Tensor, Any]


class _Stop(Exception):
    pass


@dataclass(slots=True)
class _Converted:
    """A batch ready on the device; ``ready``: its CUDA event (None on the CPU)."""

    images: torch.Tensor
    labels: torch.Tensor
    meta: Any
    ready: Any


@dataclass(frozen=True, slots=True)
class _Failed:
    error: BaseException


_END = object()  # the source is exhausted


def _not_shipped(
    images: Any, labels: torch.Tensor, meta: Any
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    raise AsyncLoaderError(f"a batch of {type(images).__name__}, and no unpacker for it")


def _is_end(item: object) -> bool:
    return item is _END


_Item = _Converted | _Failed | object


class _OutputPool:
    """Reused CPU buffers for output batches; each goes back to the pool when the last
    reference to the batch made in it is gone, from whichever thread drops it.

    Reuse matters: a fresh 77 MB tensor per batch costs page faults that take longer than
    the conversion itself.  When every buffer is still held a new one is allocated, and up
    to ``keep`` free buffers are kept for reuse.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[npt.NDArray[np.uint8]] = []
        self._size = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of at least ``nbytes`` that holds its buffer while it lives."""
        with self._lock:
            if nbytes > self._size:
                self._size = nbytes
                self._free.clear()  # too small for batches of this shape
            buf = self._free.pop() if self._free else None
        if buf is None:
            buf = np.empty(self._size, np.uint8)
        return torch.from_numpy(leased(buf, Lease(functools.partial(self._returned, buf))))

    def _returned(self, buf: npt.NDArray[np.uint8]) -> None:
        with self._lock:
            if len(self._free) < self._keep and buf.nbytes >= self._size:
                self._free.append(buf)


class _Releaser:
    """Holds source batches until their copy's CUDA event has completed, then lets them go
    (their ring slots return to the ring), from a thread of its own: the uploader queues the
    next copy at once instead of waiting for this one, so copies run back to back."""

    def __init__(self) -> None:
        self._held: queue.SimpleQueue[tuple[Any, tuple[object, ...]] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        # Daemon: a release waits on a CUDA event; one that never completes (a device
        # lost) must not keep the interpreter from exiting.  close() ends it otherwise.
        self._thread = threading.Thread(target=self._run, name="asyncloader-releaser", daemon=True)
        self._thread.start()

    def hold(self, copied: Any, *refs: object) -> None:
        """Keep ``refs`` until the event ``copied`` has completed."""
        if self.error is not None:
            raise self.error
        self._held.put((copied, refs))

    def _run(self) -> None:
        while (item := self._held.get()) is not None:
            try:
                item[0].synchronize()
            except BaseException as exc:  # a CUDA error: raised by the uploader's next hold
                self.error = self.error or exc
            del item  # the slot goes back now

    def close(self) -> None:
        """Wait until everything held has been let go."""
        self._held.put(None)
        self._thread.join()


class Uploader:
    """Keeps ``depth`` converted batches ahead of the consumer, from a thread.

    Args:
        spec: Device, dtype, normalisation and layout.
        depth: Finished batches held ready (the device queue).
        pin: CUDA only: ``"register"`` page-locks the ring's own memory (no extra copy),
            ``"staging"`` copies each slot into a pinned staging buffer first, ``"auto"``
            tries registering and falls back to staging; a ring on the device sets
            ``"device"`` (see :meth:`prepare`).
    """

    def __init__(self, spec: DeviceSpec, *, depth: int = 2, pin: str = "auto") -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        if pin not in ("auto", "register", "staging"):
            raise ValueError(f"pin must be 'auto', 'register' or 'staging', not {pin!r}")
        self.spec = spec
        self.depth = depth
        self.pin = pin
        self.cuda = spec.device.type == "cuda"
        self._affine: tuple[torch.Tensor, torch.Tensor] | None = None
        self._streams: tuple[Any, Any] | None = None  # (copy, conversion)
        self._registered: list[int] = []
        self._staging: list[torch.Tensor] = []
        self._staging_events: list[Any] = []
        self._next_staging = 0
        self._pool = _OutputPool(keep=depth + 2)
        self._scratch: torch.Tensor | None = None
        self.wait_seconds = 0.0  # consumer time spent waiting for the device queue
        # GPU decode with engine processes: turns a shipped batch (not a tensor) into the
        # batch on the device, finished, with its labels and meta (see
        # ``asyncloader._decode._gpu_batch.ShipUnpacker``); called on the uploader's thread.
        self.unpack: Callable[[Any, torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor, Any]]
        self.unpack = _not_shipped
        # CUDA: when a list, (copy start, copy end) events of every batch are appended, for
        # timelines (tests and benchmarks); None (default) records nothing.
        self.timeline: list[tuple[Any, Any]] | None = None

    # --- memory -------------------------------------------------------------------------

    def prepare(self, ring_images: npt.NDArray[np.uint8] | torch.Tensor) -> None:
        """Page-lock the ring (CUDA, ``pin`` register/auto).  Call once, before iterating.
        A ring on the device (GPU decode) needs neither registering nor staging: each slot
        is copied on the device and let go once that copy has finished."""
        if isinstance(ring_images, torch.Tensor):
            if ring_images.device != self.spec.device:
                raise ValueError(
                    f"the ring is on {ring_images.device}, the batches go to {self.spec.device}"
                )
            self.pin = "device"
            return
        if not self.cuda or self.pin == "staging" or ring_images.nbytes == 0:
            return
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        ptr = int(ring_images.ctypes.data)
        err = cudart.cudaHostRegister(ptr, int(ring_images.nbytes), 0)
        if int(err) == 0:
            self._registered.append(ptr)
            return
        if self.pin == "register":
            raise AsyncLoaderError(
                f"cudaHostRegister of the batch ring failed (CUDA error {int(err)}): "
                "pin='staging' copies through pinned buffers instead"
            )
        log.info("asyncloader: cannot page-lock the batch ring (%s); using staging", int(err))
        self.pin = "staging"

    def close(self) -> None:
        """Unregister the ring (before it is unmapped) and drop staging buffers."""
        if self._registered:
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            torch.cuda.synchronize(self.spec.device)
            for ptr in self._registered:
                with contextlib.suppress(Exception):
                    cudart.cudaHostUnregister(ptr)
            self._registered = []
        self._staging = []
        self._staging_events = []
        self._scratch = None

    # --- the stage ------------------------------------------------------------------------

    def _convert_cuda(
        self, images: torch.Tensor, labels: torch.Tensor, fresh: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, Any, Any]:
        """Queue the copy on the copy stream and the conversion on the conversion stream;
        return the outputs and the events marking the copy done (the slot is then free)
        and the batch ready.  ``fresh``: ``images`` are the batch's own, finished on the
        device (a shipped batch, decoded here), converted without a copy."""
        dev = self.spec.device
        if self._streams is None:
            self._streams = (
                torch.cuda.Stream(dev),  # type: ignore[no-untyped-call]
                torch.cuda.Stream(dev),  # type: ignore[no-untyped-call]
            )
        copying, converting = self._streams
        assert self._affine is not None
        staged = self._stage(images) if self.pin == "staging" and not fresh else None
        # The labels are a few bytes of pageable memory: copied from there, the driver may
        # wait for the stream's earlier copies.  From pinned memory the copy is queued
        # (pin_memory returns a pinned tensor itself; one already on the GPU stays).
        if labels.device.type == "cpu":
            labels = labels.pin_memory()
        with torch.cuda.stream(copying):
            start = None
            if self.timeline is not None:
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record(copying)
            src = (
                images
                if staged is None
                else self._staging[staged][: images.numel()].view(images.shape)
            )
            # A slot of a ring on the device is copied there: the batch must not be the
            # slot itself, which the ring refills once this copy is done.
            if fresh:
                d_images = src
            else:
                d_images = src.clone() if src.is_cuda else src.to(dev, non_blocking=True)
            d_labels = labels.to(dev, non_blocking=True)
            # A blocking event: whoever waits for it (the releaser, staging) sleeps, not spins.
            copied = torch.cuda.Event(enable_timing=start is not None, blocking=True)  # type: ignore[no-untyped-call]
            copied.record(copying)
        if self.timeline is not None:
            self.timeline.append((start, copied))
        if staged is not None:
            self._staging_events[staged] = copied
        with torch.cuda.stream(converting):
            converting.wait_event(copied)
            d_images.record_stream(converting)  # made on the copy stream, read here
            out = self.spec.convert(d_images, self._affine)
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record(converting)
        return out, d_labels, copied, ready

    def _convert_cpu(self, images: torch.Tensor) -> torch.Tensor:
        """Into a pooled output buffer (see :class:`_OutputPool`)."""
        assert self._affine is not None
        shape = images.shape
        out = self.spec.over(self._pool.take(self.spec.nbytes(shape)), shape)
        scratch = None
        if self.spec.dtype not in (torch.float32, torch.uint8):
            if self._scratch is None or self._scratch.numel() < images.numel():
                self._scratch = torch.empty(images.numel(), dtype=torch.float32)
            scratch = self._scratch[: images.numel()].view(shape)
        return self.spec.convert(images, self._affine, out, scratch)

    def _stage(self, images: torch.Tensor) -> int:
        """Copy a slot into the next pinned staging buffer (once its last H2D copy is done);
        return the buffer's index.  The slot itself is free as soon as this returns."""
        n = self.depth + 1
        need = images.numel()
        if not self._staging or self._staging[0].numel() < need:
            # Flat buffers, each batch viewed in its own shape (a bucketed run's differ);
            # made again, larger, once the copies out of the old ones are done.
            for ev in self._staging_events:
                if ev is not None:
                    ev.synchronize()
            self._staging = [torch.empty(need, dtype=torch.uint8).pin_memory() for _ in range(n)]
            self._staging_events = [None] * n
        i = self._next_staging
        self._next_staging = (i + 1) % n
        ev = self._staging_events[i]
        if ev is not None:
            ev.synchronize()
        self._staging[i][:need].view(images.shape).copy_(images)
        return i

    def run(
        self, source: Iterator[SourceBatch]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, Any]]:
        """Yield ``(images, labels, meta)`` converted on the device, ``depth`` ahead.

        ``source`` is advanced from the uploader thread only, and closed there when the
        consumer stops early.  Each source batch is let go of as soon as its copy is done.
        """
        if self._affine is None:
            self._affine = self.spec.affine(3, self.spec.device)
            if self.cuda:
                # Made on this thread's stream; the upload stream must not read them early.
                torch.cuda.current_stream(self.spec.device).synchronize()
        out_q: queue.Queue[_Item] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item: _Item) -> None:
            while not stop.is_set():
                try:
                    out_q.put(item, timeout=_SLICE)
                    return
                except queue.Full:
                    continue
            raise _Stop

        def work() -> None:
            releaser = None
            try:
                if self.cuda:
                    torch.cuda.set_device(self.spec.device)  # this thread's allocations
                    if self.pin != "staging":
                        releaser = _Releaser()
                while not stop.is_set():
                    try:
                        images, labels, meta = next(source)
                    except StopIteration:
                        break
                    fresh = not isinstance(images, torch.Tensor)  # shipped: decoded here
                    if fresh:
                        images, labels, meta = self.unpack(images, labels, meta)
                    if self._affine is not None and self._affine[0].shape[1] != images.shape[1]:
                        self._affine = self.spec.affine(images.shape[1], self.spec.device)
                        if self.cuda:
                            torch.cuda.current_stream(self.spec.device).synchronize()
                    assert self._affine is not None
                    ready = None
                    if self.cuda:
                        out, lab, copied, ready = self._convert_cuda(images, labels, fresh)
                        if releaser is not None:  # the slot is refilled once copied
                            releaser.hold(copied, images, labels)
                    else:
                        out, lab = self._convert_cpu(images), labels.clone()
                    # Let go of the slot now, not when the next one arrives: while this
                    # thread waits for the consumer, the ring can refill it.
                    del images, labels
                    item = _Converted(out, lab, meta, ready)
                    del out, lab
                    put(item)
                    del item
                put(_END)
            except _Stop:
                pass
            except BaseException as exc:  # handed to the consumer, raised there
                with contextlib.suppress(_Stop):
                    put(_Failed(exc))
            finally:
                if releaser is not None:
                    releaser.close()
                close = getattr(source, "close", None)
                if close is not None:
                    close()

        # Daemon: it blocks on the source's next batch or on the GPU; one left by a consumer
        # that never closed the iterator must not keep the interpreter from exiting.
        thread = threading.Thread(target=work, name="asyncloader-uploader", daemon=True)
        thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                while True:
                    try:
                        item = out_q.get(timeout=_SLICE)
                        break
                    except queue.Empty:
                        if not thread.is_alive() and out_q.empty():
                            raise PipelineDeadError("the uploader thread died") from None
                self.wait_seconds += time.perf_counter() - t0
                if _is_end(item):
                    return
                if isinstance(item, _Failed):
                    raise item.error
                assert isinstance(item, _Converted)
                if item.ready is not None:
                    current = torch.cuda.current_stream(self.spec.device)
                    current.wait_event(item.ready)
                    item.images.record_stream(current)
                    item.labels.record_stream(current)
                # No reference stays in this frame while it waits at `yield`.
                batch = [(item.images, item.labels, item.meta)]
                del item
                yield batch.pop()
        finally:
            stop.set()
            thread.join(30)
