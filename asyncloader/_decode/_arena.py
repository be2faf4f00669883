"""The bytes arena: fetched objects handed to decode processes through shared memory.

Without it, each object's bytes are pickled into the worker's socket and copied out again
on the other side.  With it, the parent copies them once into a free extent of a shared
segment the workers have attached, and sends only ``ArenaSlice(offset, size)``; the worker
decodes from a view of the segment, in place, and the extent is free again when the
worker's answer comes back.  Bounded: when no extent is free (objects larger than the
arena, or all of it in flight), the bytes go through the socket as before.

The worker side imports it too (it needs nothing but the standard library).
"""

from __future__ import annotations

import bisect
import dataclasses

from .._base._shm import Segment
from .._base._types import ArenaSlice, DecodeJob

__all__ = ["ALIGN", "Arena", "ArenaSlice", "Extents"]

ALIGN = 64
"""Extents start on cache-line boundaries."""


class Extents:
    """First-fit allocation of ``capacity`` bytes, free extents kept sorted and merged.

    Pure bookkeeping (no memory of its own): the pool pairs it with a shared segment.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < ALIGN:
            raise ValueError(f"an arena needs at least {ALIGN} bytes")
        self.capacity = capacity - capacity % ALIGN
        self._starts: list[int] = [0]  # free extents, sorted by start
        self._sizes: list[int] = [self.capacity]
        self.used = 0

    def alloc(self, size: int) -> int | None:
        """The offset of ``size`` free bytes (rounded up to :data:`ALIGN`), or None."""
        need = max(ALIGN, -(-size // ALIGN) * ALIGN)
        for i, free in enumerate(self._sizes):
            if free >= need:
                start = self._starts[i]
                if free == need:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += need
                    self._sizes[i] -= need
                self.used += need
                return start
        return None

    def free(self, offset: int, size: int) -> None:
        """Give back what :meth:`alloc` returned for ``size`` bytes at ``offset``."""
        n = max(ALIGN, -(-size // ALIGN) * ALIGN)
        i = bisect.bisect_left(self._starts, offset)
        if (i < len(self._starts) and self._starts[i] < offset + n) or (
            i > 0 and self._starts[i - 1] + self._sizes[i - 1] > offset
        ):
            raise ValueError(f"extent {offset}+{n} is (partly) free already")
        self.used -= n
        # Merge with the free neighbours.
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == offset:
            i -= 1
            self._sizes[i] += n
        else:
            self._starts.insert(i, offset)
            self._sizes.insert(i, n)
        if i + 1 < len(self._starts) and self._starts[i] + self._sizes[i] == self._starts[i + 1]:
            self._sizes[i] += self._sizes[i + 1]
            del self._starts[i + 1], self._sizes[i + 1]

    @property
    def free_extents(self) -> list[tuple[int, int]]:
        """(start, size) of each free extent, in order."""
        return list(zip(self._starts, self._sizes, strict=True))


class Arena:
    """The parent's side: a shared segment of ``size`` bytes and its extents, its pages
    reserved when made (see :mod:`asyncloader._base._shm`: an
    ``AsyncLoaderError`` where ``/dev/shm`` has no room).

    Attributes:
        ref: The segment, for the workers to map.
        jobs: Jobs whose bytes went through it.
    """

    def __init__(self, size: int, *, tracked: bool = True) -> None:
        what = f"the decode workers' arena of {size >> 20} MiB"
        self._segment: Segment | None = Segment.new(size, what, tracked=tracked)
        self.ref = self._segment.ref
        self._view: memoryview | None = self._segment.buf
        self._extents = Extents(size)
        self.jobs = 0

    @property
    def used(self) -> int:
        """Bytes in extents not given back."""
        return self._extents.used

    def put(self, job: DecodeJob) -> DecodeJob:
        """The job with its bytes copied into a free extent (as is when none is free, the
        arena is closed, or its data is not bytes)."""
        data = job.data
        if self._view is None or not isinstance(data, bytes | bytearray | memoryview):
            return job
        size = len(data)
        offset = self._extents.alloc(size)
        if offset is None:
            return job
        self._view[offset : offset + size] = data
        self.jobs += 1
        return dataclasses.replace(job, data=ArenaSlice(offset, size))

    def release(self, job: DecodeJob) -> None:
        """The job is answered (or given up): its extent is free again."""
        data = job.data
        if isinstance(data, ArenaSlice):
            self._extents.free(data.offset, data.size)

    def close(self) -> None:
        """Unmap the segment (no worker reads it any more), unlinked where it has a name;
        idempotent."""
        segment, self._segment = self._segment, None
        self._view = None
        if segment is not None:
            segment.close()
