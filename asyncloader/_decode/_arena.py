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

from .._base._types import ArenaSlice

__all__ = ["ALIGN", "ArenaSlice", "Extents"]

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
