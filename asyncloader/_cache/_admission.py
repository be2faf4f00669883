"""Which objects a cache too small for a node's data keeps: a fixed subset, the same for
every process, epoch and run (pure)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["ADMIT_ALL", "ADMIT_HEADROOM", "admission", "admitted"]

# Of a cache too small for the data a node reads, the share the admitted subset fills: the
# rest is room for the index, and for the pack being filled when the oldest is dropped.
ADMIT_HEADROOM = 0.9

ADMIT_ALL = 2**64
"""The admission threshold that admits every object."""


def admission(objects: Iterable[tuple[str, int]], size_limit: int) -> tuple[int, float]:
    """The admission threshold of a cache of ``size_limit`` bytes for a node that reads
    ``objects`` ((key, size) pairs: exactly those it reads, see ``_run/_cache_fill``), and
    the share of their bytes it keeps: ``(ADMIT_ALL, 1.0)`` when they fit, else the hash
    rank below which the objects fill ``ADMIT_HEADROOM`` of the limit.

    A shuffled scan of data larger than the cache, with every object written and the least
    recently stored evicted, keeps almost nothing that is read again before it goes (3000
    objects through a cache of a third of their size hit 6 %); a fixed subset is hit at its
    share, every epoch, and nothing outside it is ever written.
    """
    pairs = [(key, max(size, 0)) for key, size in objects]
    total = sum(size for _, size in pairs)
    if total <= size_limit:
        return ADMIT_ALL, 1.0
    ranked = sorted((_rank(key), size) for key, size in pairs)  # ~1.5 s per million keys
    budget, filled = ADMIT_HEADROOM * size_limit, 0
    for rank, size in ranked:
        if filled + size > budget:
            return rank, filled / total
        filled += size
    return ADMIT_ALL, 1.0


def admitted(key: str, threshold: int) -> bool:
    """Whether object ``key`` is in the cached subset (see :func:`admission`): a hash of the
    key, so every process, epoch and run (loaders and ``warm``) keeps the same objects."""
    return threshold >= ADMIT_ALL or _rank(key) < threshold


def _rank(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
