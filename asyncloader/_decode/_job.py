"""A decode job as a worker runs it (cache read, then pixels), and the protocol the pools
implement (decode threads, and the GPU's)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from .._base._errors import DecodeError, shown_key
from .._base._types import (
    Blob,
    BlobCache,
    CachedAt,
    CacheEvent,
    DecodeJob,
    Outcome,
    derived_key,
)
from ._image import (
    SCALED_COPY_MIN,
    DecodeSpec,
    U8Array,
    decode_into,
    decode_scale,
    scaled_name,
)

__all__ = ["DecodePool", "job_bytes", "run_job", "sample_view"]


def sample_view(images: U8Array, job: DecodeJob) -> U8Array:
    """Where the job's sample goes in the ring's ``images`` (slots, batch, C, H, W): its
    place, or a bucketed batch's (``job.mark``: packed from the slot's start, the bucket's
    height and width)."""
    if job.mark is None:
        view: U8Array = images[job.slot, job.index]
        return view
    bh, bw = job.mark[0], job.mark[1]
    c = images.shape[2]
    n = c * bh * bw
    flat: U8Array = images[job.slot].reshape(-1)
    return flat[job.index * n : (job.index + 1) * n].reshape(c, bh, bw)


def run_job(job: DecodeJob, out: U8Array, spec: DecodeSpec) -> Outcome:
    """One decode job as workers run it: a cache read if need be, then decode into ``out``
    (the job's sample of the ring).

    ``data=None`` means "look in the cache", a :class:`CachedAt` "read the cache at this
    place" (found by the batch's one index query): a miss returns ``MISS`` without
    decoding.  With ``spec.scaled_copies``, a large object's hit is decoded from its
    scaled copy where the crop's scale has one (``SCALED``), without reading the object.
    Fetched bytes reach the cache another way (the pipeline's
    :class:`~asyncloader._cache._writer.CacheWriter`), off the decode path.
    """
    t0 = time.perf_counter()
    data, events = job_bytes(job, spec)
    if data is None:
        return Outcome(time.perf_counter() - t0, events)
    decode_into(data, out, spec, job.seed, job.key, job.mark)
    return Outcome(time.perf_counter() - t0, events)


def job_bytes(job: DecodeJob, spec: DecodeSpec) -> tuple[Blob | None, CacheEvent]:
    """The bytes a job decodes, read from the cache where the job says so, and what
    happened there; None (with ``MISS``) when the cache no longer has them."""
    events = CacheEvent.NONE
    data, cache_key, size = job.data, job.cache_key, job.size
    if data is None or isinstance(data, CachedAt):
        cache = spec.cache if cache_key else None
        if cache is None:
            raise DecodeError(f"no cache to read {shown_key(job.key)} from", key=job.key)
        copy = None
        if spec.scaled_copies and size >= SCALED_COPY_MIN:
            copy = _scaled_copy(cache, cache_key, spec, job.seed, job.mark)
        if copy is not None:
            data = copy
            events |= CacheEvent.SCALED
        elif data is None:
            data = cache.get(cache_key, size)
        else:
            data = cache.read(cache_key, size, data)
        if cache.take_damaged():
            events |= CacheEvent.DAMAGED
        if data is None:
            return None, events | CacheEvent.MISS
        events |= CacheEvent.HIT
    return data, events


def _scaled_copy(
    cache: BlobCache,
    cache_key: str,
    spec: DecodeSpec,
    seed: int,
    mark: tuple[int, int, int, int] | None,
) -> bytes | None:
    """The entry's scaled copy that this sample's decode can use instead of the object
    (the same pixels from less data), or None: none was made, the crop needs a larger
    scale, or the copy is damaged (dropped, and counted by ``take_damaged``).  ``mark``: a
    bucketed sample's (its bucket's crop decides the scale).

    The 1/8 copy is read first, small as it is: its header gives the image's size, so the
    crop and its scale, without reading the object."""
    small = cache.get(derived_key(cache_key, scaled_name(8)), -1)
    if small is None:
        return None
    try:
        scale = decode_scale(small, spec, seed, mark)
    except Exception:  # a copy Pillow cannot open: the object decides
        return None
    if scale == 8:
        return small
    if scale == 4:
        return cache.get(derived_key(cache_key, scaled_name(4)), -1)
    return None


class DecodePool(Protocol):
    """Runs :func:`run_job` for one sample into ``slot``/``index`` of the ring."""

    workers: int

    async def decode(self, job: DecodeJob, priority: int = 0) -> Outcome:
        """Run one job.  Queued jobs run lowest ``priority`` first (the pipeline passes its
        batch's place in the stream, so a later batch never holds up an earlier one), in
        the order they came within one priority.

        Raises:
            DecodeError: the sample could not be decoded (or a worker died on it twice).
            PipelineDeadError: the pool is broken or closed.
        """
        ...

    async def decode_many(
        self, jobs: Sequence[DecodeJob], priority: int = 0
    ) -> list[Outcome | BaseException]:
        """Several :meth:`decode` jobs awaited as one (per-job result or exception)."""
        ...

    async def drain(self) -> None:
        """Wait until no job can still write into a ring slot."""
        ...

    async def aclose(self) -> None:
        """Stop the workers; the waiting happens off the event loop."""
        ...
