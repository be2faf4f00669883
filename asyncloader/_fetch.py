"""Fetch: object bytes from a store with bounded concurrency, retries, ranges and checks;
and the object list of a store, through the cache's saved listing.

Runs on the loader's (or ``warm``'s) event loop.  It never touches the cache's values: the
decode workers write fetched bytes back, ``warm``'s writer thread stores them.
"""

from __future__ import annotations

import asyncio
import random

from ._cache import ObjectCache
from ._config import FetchConfig
from ._env import usable_cpus
from ._errors import LengthMismatch, StoreError, Throttled, shown_key
from ._retry import retrying
from ._stats import Counters
from ._types import Blob, ObjectInfo, ObjectStore

__all__ = ["Fetcher", "list_objects", "saved_listing"]


class Fetcher:
    """Fetches whole objects with bounded concurrency, retries, ranges and checks."""

    def __init__(self, store: ObjectStore, counters: Counters, config: FetchConfig) -> None:
        self.store = store
        self.config = config.for_workers(usable_cpus())  # unless the caller sized it
        self._c = counters
        self._sem = asyncio.Semaphore(self.config.inflight)
        self._rng = random.Random()

    async def fetch(self, obj: ObjectInfo) -> Blob:
        """Return the object's bytes, verified against its listed size and ETag.

        An answer of the wrong length is asked for again (a retry), like a throttled or
        failed request; only one that persists fails.

        Raises:
            StoreError: after retries ran out (LengthMismatch for a length that stayed
                wrong), or at once for errors that are not transient (IntegrityError for a
                changed ETag, ObjectNotFound, AccessDenied, ...).
        """
        c = self._c
        t0 = asyncio.get_running_loop().time()
        size = obj.size
        if size > self.config.range_threshold:
            data = await self._fetch_ranges(obj)
        else:
            data = await self._request(obj.key, 0, None, obj.etag, size if size >= 0 else None)
        c.objects_fetched += 1
        c.fetch_seconds += asyncio.get_running_loop().time() - t0
        return data

    async def _fetch_ranges(self, obj: ObjectInfo) -> Blob:
        part = self.config.part_size
        buf = bytearray(obj.size)

        async def one(start: int) -> None:
            end = min(start + part, obj.size)
            buf[start:end] = await self._request(obj.key, start, end, obj.etag)

        # A TaskGroup cancels the other parts as soon as one fails for good.
        async with asyncio.TaskGroup() as tg:
            for start in range(0, obj.size, part):
                tg.create_task(one(start))
        return buf

    async def _request(
        self, key: str, start: int, end: int | None, etag: str, size: int | None = None
    ) -> Blob:
        """One object or range, retried; ``size``: the whole object's listed length."""
        c = self._c

        async def attempt() -> Blob:
            # One try holds an in-flight slot; the backoff between tries does not.
            async with self._sem:
                c.requests += 1
                c.inflight += 1
                c.inflight_peak = max(c.inflight_peak, c.inflight)
                try:
                    data = await self.store.get(key, start=start, end=end, etag=etag)
                finally:
                    c.inflight -= 1
            c.bytes_fetched += len(data)
            if size is not None and len(data) != size:
                raise LengthMismatch(
                    f"{shown_key(key)}: received {len(data)} bytes, listed size is {size}",
                    key=key,
                )
            return data

        def count(err: StoreError) -> None:
            reason = "transient"
            if isinstance(err, Throttled):
                reason = "throttled"
            elif isinstance(err, LengthMismatch):
                reason = "short"
            c.retries[reason] += 1

        return await retrying(attempt, self.config, on_retry=count, rng=self._rng)


async def saved_listing(
    store: ObjectStore, cache: ObjectCache | None, max_age: float
) -> list[ObjectInfo] | None:
    """The object list the cache saved for the store's URL, if younger than ``max_age``."""
    if cache is None or max_age <= 0:
        return None
    return await asyncio.to_thread(cache.load_listing, store.url, max_age)


async def list_objects(
    store: ObjectStore, cache: ObjectCache | None, max_age: float
) -> list[ObjectInfo]:
    """The store's object list: from the cache's saved listing if young enough, else listed
    (in parallel where the store can) and saved for the next run."""
    saved = await saved_listing(store, cache, max_age)
    if saved is not None:
        return saved
    objects = [o async for o in store.list()]
    if cache is not None:
        await asyncio.to_thread(cache.save_listing, store.url, objects)
    return objects
