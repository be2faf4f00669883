"""What a cache folder holds, in numbers, and sizes as people write them."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CacheStats", "parse_size"]

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(size: int | str) -> int:
    """``"500GB"`` → 500·10⁹ bytes; ``"2GiB"`` → 2·2³⁰; an int is bytes already.

    Raises:
        ValueError: not a size.
    """
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", size)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {size!r} (examples: 500GB, 64GiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What is in a cache directory: entries, bytes [bytes] and the size limit [bytes]."""

    directory: str
    entries: int
    volume: int
    size_limit: int
