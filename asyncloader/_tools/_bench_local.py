"""What ``bench`` measures on this machine, beside the store: which sampled objects decode,
the CPU per image of decode + transform and what the decode workers do together, and the
cache disk's write and read rates."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .._base._errors import AsyncLoaderError, shown_key
from .._base._types import Blob
from .._cache import ObjectCache
from .._decode import DecodeSpec, decode_into
from .._decode._transforms import RandomResizedCrop

__all__ = ["MAX_SAMPLE_BYTES", "decodable", "decode_rates", "disk_rates"]

MAX_SAMPLE_BYTES = 96 << 20
"""The most bytes of sampled objects ``bench`` holds (and writes to the scratch cache)."""


def decodable(
    bodies: Sequence[tuple[str, Blob]], size: int
) -> tuple[list[tuple[str, Blob]], list[str]]:
    """The sampled objects that decode, and the keys of those that do not (left out of the
    measurement, and said in the report: a loader would skip or fail on them).

    Raises:
        AsyncLoaderError: none of them decodes.
    """
    spec = DecodeSpec((3, size, size), RandomResizedCrop(size))
    out = np.empty((3, size, size), np.uint8)
    good, bad = [], []
    for i, (key, data) in enumerate(bodies):
        try:
            decode_into(data, out, spec, i, key)
        except Exception:
            bad.append(shown_key(key))
        else:
            good.append((key, data))
    if not good:
        raise AsyncLoaderError(
            f"none of the {len(bodies)} sampled objects decodes as an image "
            f"(for example {bad[0]}): nothing to measure"
        )
    return good, bad


def decode_rates(
    bodies: Sequence[tuple[str, Blob]], workers: int, seconds: float, size: int
) -> tuple[float, float]:
    """(CPU seconds per image on one thread, images/s of ``workers`` threads together),
    over ``bodies`` that decode (:func:`decodable`)."""
    transform = RandomResizedCrop(size)
    spec = DecodeSpec((3, size, size), transform)

    def run(stop: Callable[[], bool], start: int, step: int) -> int:
        out = np.empty((3, size, size), np.uint8)
        n, i = 0, start
        while not stop():
            key, data = bodies[i % len(bodies)]
            decode_into(data, out, spec, i, key)
            n += 1
            i += step
        return n

    one_until = time.perf_counter() + seconds / 3
    c0 = time.thread_time()
    n = run(lambda: time.perf_counter() > one_until, 0, 1)
    per_image = (time.thread_time() - c0) / max(n, 1)
    until = time.perf_counter() + seconds * 2 / 3
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        counts = list(
            pool.map(lambda w: run(lambda: time.perf_counter() > until, w, workers), range(workers))
        )
    rate = sum(counts) / (time.perf_counter() - t0)
    return per_image, rate


def disk_rates(
    directory: str, bodies: Sequence[tuple[str, Blob]], workers: int
) -> dict[str, float | str]:
    """Write the sample to a scratch cache inside ``directory``, drop it from the page
    cache, read it back with ``workers`` threads; remove the scratch cache."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".bench-", dir=directory)
    try:
        cache = ObjectCache(scratch, size_limit=4 * MAX_SAMPLE_BYTES)
        items = [(f"bench/{i}", data) for i, (_, data) in enumerate(bodies)]
        total = sum(len(d) for _, d in items)
        t0 = time.perf_counter()
        for i in range(0, len(items), 32):
            cache.put_many(items[i : i + 32])
        packs = list(Path(scratch, "packs").glob("*"))
        for p in packs:
            with open(p, "rb+") as w:
                os.fsync(w.fileno())
        write_s = time.perf_counter() - t0
        for p in packs:  # the next reads come from the disk, not from memory
            with open(p, "rb") as f, contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        local = threading.local()

        def read(item: tuple[str, Blob]) -> int:
            if not hasattr(local, "cache"):
                local.cache = ObjectCache(scratch, size_limit=cache.size_limit)
            got = local.cache.get(item[0], len(item[1]))
            return len(got) if got is not None else 0

        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            read_bytes = sum(pool.map(read, items))
        read_s = time.perf_counter() - t0
        cache.close()
        return {
            "directory": directory,
            "write_mb_per_second": total / max(write_s, 1e-9) / 1e6,
            "read_mb_per_second": read_bytes / max(read_s, 1e-9) / 1e6,
            "read_objects_per_second": len(items) / max(read_s, 1e-9),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
