"""The batch ring: a fixed number of batch buffers, the loader's bounded prefetch queue.

Memory is ``slots × batch_size × C × H × W`` bytes for the images, allocated once.  Filled
by another process (an engine process) the buffers live in one segment of shared memory
(:mod:`asyncloader._base._shm`: a memfd on Linux) that both processes map; else they are
ordinary memory.  Which slot is free or full is the pipeline's business, not the ring's;
the ring hands out batches and knows which are still referenced.

Batch lifetime: :meth:`BatchRing.lease` gives the consumer views of a slot that hold it
(see :mod:`asyncloader._base._lease`).  The slot goes back to the pipeline (``on_release``) when
the last tensor or view of that batch is freed, whenever and in whichever thread that
happens.  Closing the ring while batches are still held keeps the shared memory until the
last of them goes (they stay readable); it is unmapped then, or at interpreter exit.
"""

from __future__ import annotations

import atexit
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from .._base._errors import ClosedError
from .._base._lease import Lease, leased
from .._base._shm import Segment, SegmentRef
from .._base._types import SHIP_RECORD, Shipped

__all__ = ["BatchRing", "DeviceBatchRing"]

# Closed rings whose batches are still referenced: unmapped at exit if they outlive it.
_pending: weakref.WeakSet[BatchRing] = weakref.WeakSet()
_unclosable: list[Segment] = []


class BatchRing:
    """``slots`` batch buffers of ``batch_size`` samples of ``sample_shape`` uint8 each.

    Attributes:
        images: uint8 array (slots, batch_size, *sample_shape).
        labels: int64 array (slots, batch_size).
        ref: How another process maps its segment, or None for private memory.
        limit: Slots in use: all of them, or fewer where an epoch has fewer batches (its
            engine does not fill a ring with epochs no one may read; see
            :meth:`BatchOrder.slots_for <asyncloader._run._batches.BatchOrder.slots_for>`).
            Set once, by the pipeline that fills the ring; in shared memory with the
            slots, so the process that maps the ring reads what the engine set.
        on_release: Called with a slot when the last reference to the batch leased from it
            is gone; from any thread, so it must be thread-safe (the loader hands the slot
            to the event loop).  Not called after :meth:`close`.
        records: With an ``arena`` (a shipped ring: GPU decode in the training process,
            its engine in a process of its own): :data:`~asyncloader._base._types.SHIP_RECORD`
            (slots, batch_size), where each sample is; else None.
        arena: uint8 (slots, ``arena`` bytes): each slot's shipped JPEG bytes; else None.
    """

    def __init__(
        self,
        slots: int,
        batch_size: int,
        sample_shape: tuple[int, ...],
        *,
        shared: bool,
        attach: SegmentRef | None = None,
        arena: int = 0,
    ) -> None:
        if slots < 2 and attach is None:
            raise ValueError("the ring needs at least 2 slots (one filling, one consumed)")
        self.slots = slots
        self.batch_size = batch_size
        self.on_release: Callable[[int], None] | None = None
        shape = (slots, batch_size, *sample_shape)
        nbytes = int(np.prod(shape))
        self._segment: Segment | None = None
        # Reentrant: a lease can be freed by the garbage collector while this thread holds
        # the lock (a collection can start at any allocation).
        self._lock = threading.RLock()
        self._held = 0
        self._closed = False
        self.images: npt.NDArray[np.uint8]
        self.labels: npt.NDArray[np.int64]
        self.records: npt.NDArray[np.void] | None = None
        self.arena: npt.NDArray[np.uint8] | None = None
        # How many slots are in use (:attr:`limit`), one number.
        self._in_use: npt.NDArray[np.int64]
        if arena and not (shared or attach is not None):
            raise ValueError("an arena is for a ring in shared memory")
        if shared or attach is not None:
            # The labels follow the images in the same segment (8-byte aligned), then a
            # shipped ring's records and arenas, then the slots in use: a ring filled by
            # another process hands over all of them.
            at = -(-nbytes // 8) * 8
            end = at + 8 * slots * batch_size
            records_at, arena_at = end, end + SHIP_RECORD.itemsize * slots * batch_size
            if arena:
                end = arena_at + -(-arena * slots // 8) * 8
            if attach is not None:
                self._segment = seg = Segment.attach(attach)
            else:
                what = f"a ring of {slots} batches of {batch_size} samples of {sample_shape}"
                if arena:
                    what += (
                        f" with {arena / 1e6:.0f} MB a batch for the JPEGs shipped to the GPU "
                        "(DecodeConfig(ship_bytes=), per sample)"
                    )
                self._segment = seg = Segment.new(end + 8, what)
            self.images = np.ndarray(shape, np.uint8, buffer=seg.buf)
            self.labels = np.ndarray((slots, batch_size), np.int64, buffer=seg.buf, offset=at)
            if arena:
                self.records = np.ndarray(
                    (slots, batch_size), SHIP_RECORD, buffer=seg.buf, offset=records_at
                )
                self.arena = np.ndarray((slots, arena), np.uint8, buffer=seg.buf, offset=arena_at)
            self._in_use = np.ndarray((1,), np.int64, buffer=seg.buf, offset=end)
            if attach is None:
                self._in_use[0] = slots
        else:
            self.images = np.empty(shape, np.uint8)
            self.labels = np.zeros((slots, batch_size), np.int64)
            self._in_use = np.array([slots], np.int64)

    @property
    def limit(self) -> int:
        """Slots in use (see the class's docstring)."""
        return int(self._in_use[0])

    @limit.setter
    def limit(self, slots: int) -> None:
        self._in_use[0] = slots

    @property
    def ref(self) -> SegmentRef | None:
        return self._segment.ref if self._segment is not None else None

    @property
    def nbytes(self) -> int:
        shipped = 0 if self.arena is None or self.records is None else self.arena.nbytes
        return int(self.images.nbytes + self.labels.nbytes + shipped)

    @property
    def held(self) -> int:
        """Slots whose batch is still referenced (by the consumer, or the uploader)."""
        return self._held

    def lease(
        self, slot: int, n: int, shape: tuple[int, int] | None = None
    ) -> tuple[npt.NDArray[np.uint8] | Shipped, npt.NDArray[np.int64]]:
        """Views of the first ``n`` samples of ``slot`` (images, labels) that hold the slot
        until both, and everything made from them, are gone.  ``shape``: a bucketed
        batch's ``(height, width)`` (its samples packed at the slot's start).  A shipped
        ring's images are a :class:`~asyncloader._base._types.Shipped` batch.

        Raises:
            ClosedError: the ring is closed.
        """
        lease = self._take(slot)
        images = self.images[slot, :n] if shape is None else self.batch_view(slot, shape)[:n]
        labels = leased(self.labels[slot, :n], lease)
        if self.records is not None and self.arena is not None:
            return (
                Shipped(
                    leased(images, lease),
                    leased(self.records[slot, :n], lease),
                    leased(self.arena[slot], lease),
                ),
                labels,
            )
        return leased(images, lease), labels

    def batch_view(self, slot: int, shape: tuple[int, int]) -> npt.NDArray[np.uint8]:
        """``slot`` as a bucketed batch of ``shape``: ``[batch_size, C, height, width]``,
        packed from the slot's start (the slot holds the largest bucket)."""
        h, w = shape
        c = self.images.shape[2]
        flat: npt.NDArray[np.uint8] = self.images[slot].reshape(-1)
        return flat[: self.batch_size * c * h * w].reshape(self.batch_size, c, h, w)

    def _take(self, slot: int) -> Lease:
        """A lease that holds ``slot`` until it is let go.

        Raises:
            ClosedError: the ring is closed (its loader was closed, from another thread
                while a batch was on its way, say): no batch is handed out of it any more,
                and its memory may be gone.
        """
        with self._lock:
            if self._closed:
                raise ClosedError("the loader is closed")
            self._held += 1
        return Lease(functools.partial(self._returned, slot))

    def compact(self, slot: int, keep: list[int], shape: tuple[int, int] | None = None) -> None:
        """Move the samples ``keep`` of ``slot`` to its front, in order (a batch whose
        other samples failed; ``shape``: a bucketed one's)."""
        n = len(keep)
        images = self.images[slot] if shape is None else self.batch_view(slot, shape)
        images[:n] = images[keep]
        self.labels[slot, :n] = self.labels[slot, keep]
        if self.records is not None:  # the bytes stay where they are in the arena
            self.records[slot, :n] = self.records[slot, keep]

    def _returned(self, slot: int) -> None:
        with self._lock:
            self._held -= 1
            last = self._closed and self._held == 0
            release = None if self._closed else self.on_release
        if release is not None:
            release(slot)
        if last:
            self._unlink()

    def close(self) -> None:
        """Stop handing slots back; free the shared memory once no batch references it.

        Idempotent.  Until then the segment stays mapped and every batch still held stays
        readable; whatever is left at interpreter exit is unmapped then.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.on_release = None
            now = self._held == 0
        if now:
            self._unlink()
        else:
            _pending.add(self)

    def _unlink(self) -> None:
        segment, self._segment = self._segment, None
        _pending.discard(self)
        if segment is None:
            return
        self.images = np.empty((0,), np.uint8)
        self.labels = np.empty((0,), np.int64)
        self.records = self.arena = None
        self._in_use = np.array([self.limit], np.int64)  # a view of the segment no more
        try:
            segment.close()
        except BufferError:
            # Something else still views the mapping (closing it under a live view would
            # crash the reader): keep it mapped until exit.
            _unclosable.append(segment)


class DeviceBatchRing(BatchRing):
    """A ring whose images live on a device (GPU decode writes them there); the labels
    stay in host memory.

    A lease holds its slot while the labels' view lives; the images' view is a plain
    device tensor, read by the uploader (which copies or converts it, then lets the lease
    go once that work has finished on the GPU) and never handed to the consumer itself.
    """

    def __init__(
        self, slots: int, batch_size: int, sample_shape: tuple[int, ...], *, device: Any
    ) -> None:
        import torch

        super().__init__(slots, batch_size, (0,), shared=False)
        self.device = torch.device(device)
        self.images = torch.empty(  # type: ignore[assignment]
            (slots, batch_size, *sample_shape), dtype=torch.uint8, device=device
        )

    @property
    def nbytes(self) -> int:
        return int(self.images.nbytes + self.labels.nbytes)

    def lease(
        self, slot: int, n: int, shape: tuple[int, int] | None = None
    ) -> tuple[Any, npt.NDArray[np.int64]]:
        assert shape is None  # GPU decode makes no bucketed batches (refused in _build)
        return self.images[slot, :n], leased(self.labels[slot, :n], self._take(slot))

    def compact(self, slot: int, keep: list[int], shape: tuple[int, int] | None = None) -> None:
        import torch

        super().compact(slot, keep)
        if self.device.type == "cuda":
            # Written on this thread's stream: finished before the uploader's copy reads.
            torch.cuda.current_stream(self.device).synchronize()


@atexit.register
def _unlink_pending() -> None:
    for ring in list(_pending):
        ring._unlink()
