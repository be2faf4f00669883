"""A decode job as a worker runs it (cache read, then pixels), and the protocol both pools
implement."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from .._errors import DecodeError, shown_key
from .._types import ArenaSlice, CachedAt, CacheEvent, DecodeJob, Outcome
from ._image import DecodeSpec, U8Array, decode_into

__all__ = ["DecodePool", "run_job"]


def run_job(job: DecodeJob, out: U8Array, spec: DecodeSpec) -> Outcome:
    """One decode job as workers run it: a cache read if need be, then decode into ``out``
    (the job's sample of the ring).

    ``data=None`` means "look in the cache", a :class:`CachedAt` "read the cache at this
    place" (found by the batch's one index query): a miss returns ``MISS`` without
    decoding.  Fetched bytes reach the cache another way (the pipeline's
    :class:`~asyncloader._cache_writer.CacheWriter`), off the decode path.
    """
    t0 = time.perf_counter()
    events = CacheEvent.NONE
    data, cache_key, size = job.data, job.cache_key, job.size
    if isinstance(data, ArenaSlice):  # the worker resolves these before running the job
        raise DecodeError(f"bytes of {shown_key(job.key)} left in the arena", key=job.key)
    if data is None or isinstance(data, CachedAt):
        cache = spec.cache if cache_key else None
        if cache is None:
            raise DecodeError(f"no cache to read {shown_key(job.key)} from", key=job.key)
        data = cache.get(cache_key, size) if data is None else cache.read(cache_key, size, data)
        if cache.take_damaged():
            events |= CacheEvent.DAMAGED
        if data is None:
            return Outcome(time.perf_counter() - t0, events | CacheEvent.MISS)
        events |= CacheEvent.HIT
    decode_into(data, out, spec, job.seed, job.key)
    return Outcome(time.perf_counter() - t0, events)


class DecodePool(Protocol):
    """Runs :func:`run_job` for one sample into ``slot``/``index`` of the ring."""

    workers: int
    restarts: int

    async def decode(self, job: DecodeJob) -> Outcome:
        """Run one job.

        Raises:
            DecodeError: the sample could not be decoded (or a worker died on it twice).
            PipelineDeadError: the pool is broken or closed.
        """
        ...

    async def decode_many(self, jobs: Sequence[DecodeJob]) -> list[Outcome | BaseException]:
        """Several :meth:`decode` jobs awaited as one (per-job result or exception)."""
        ...

    async def drain(self) -> None:
        """Wait until no job can still write into a ring slot."""
        ...

    async def aclose(self) -> None:
        """Stop the workers; the waiting happens off the event loop."""
        ...
