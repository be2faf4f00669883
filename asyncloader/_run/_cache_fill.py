"""Objects on their way into the SSD cache, each fetched once: the cache-fill stage that the
loader's pipeline and ``warm`` share (:class:`CacheFill`: the index thread, the writer
thread, admission and the fetch-once table, made and closed in one place).

The loader runs into the next epoch while this one is still fetched and written, so a batch
may need an object that another batch is fetching, or whose bytes wait for the cache's
writer: it shares them instead of sending a second GET.  An object goes fetching -> held by
the writer -> in the index, so a batch that looks at the first two *before* its index query
misses none (one that leaves the writer meanwhile is in the index when the query runs).  An
object that none of the three held at the batch's query may have been fetched and written
by another batch by the time this one's fetch would start: it looks at the first two again
then, and at the writer's record of the objects it wrote last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._base._config import RunConfig
from .._base._stats import Counters
from .._base._types import Blob, ObjectInfo
from .._cache import IndexThread, ObjectCache
from .._cache._admission import admission
from .._cache._writer import CacheWriter
from .._decode import scaled_footprint
from .._fetch import Fetcher
from ._sampler import node_subset

__all__ = ["CacheFill", "InHand", "OnceFetcher", "node_admission"]

InHand = Blob | asyncio.Future[Blob]
"""An object's bytes waiting to be written, or its fetch in flight."""


def node_admission(
    objects: list[ObjectInfo], run: RunConfig, size_limit: int, *, scaled: bool
) -> tuple[int, float]:
    """The cache's admission threshold for the objects this node reads of ``objects``, and
    the share of them it keeps (see :func:`~asyncloader._cache._admission.admission`).

    Shuffled globally, a node reads everything over the epochs; node-local, its subset;
    unshuffled, its ranks' fixed shards.  With ``scaled`` copies, each large JPEG counts
    with them (``warm --scaled-jpegs`` counts them the same way, so both keep one subset).
    """
    part = 1.0
    if run.shuffle == "node" and run.local_world_size:
        nodes = max(run.world_size // run.local_world_size, 1)
        node = run.rank // run.local_world_size
        mine = node_subset(len(objects), seed=run.seed, node=node, nodes=nodes)
        objects = [objects[int(i)] for i in mine]
    elif not run.shuffle:  # the fixed shards of this node's ranks
        part = min((run.local_world_size or run.world_size) / run.world_size, 1.0)
    footprint = scaled_footprint if scaled else int
    return admission(((o.key, footprint(o.size)) for o in objects), size_limit, part)


class OnceFetcher:
    """Fetches for the cache, shared while they are in flight or wait to be written (used
    on the loop only).

    Args:
        fetcher: Sends the requests.
        writer: Where fetched objects go.
        admit: Whether the cache keeps an object (by its key); others are fetched plainly,
            and not shared.
        counters: Counts objects the writer had no room for.
        wait_for_room: When the writer is full, wait for room (``warm``: caching is the
            job) instead of leaving the object out of the cache this time (the loader:
            the epoch must not slow down for the disk).
    """

    def __init__(
        self,
        fetcher: Fetcher,
        writer: CacheWriter,
        admit: Callable[[str], bool],
        counters: Counters,
        *,
        wait_for_room: bool = False,
    ) -> None:
        self._fetcher = fetcher
        self._writer = writer
        self._admit = admit
        self._counters = counters
        self._wait = wait_for_room
        self._fetching: dict[str, asyncio.Future[Blob]] = {}  # by cache key

    def in_hand(self, cache_key: str) -> InHand | None:
        """The object's fetch in flight, or its bytes waiting to be written; None if
        neither."""
        fetching = self._fetching.get(cache_key)
        return fetching if fetching is not None else self._writer.held(cache_key)

    def written_lately(self, cache_key: str) -> bool:
        """Whether the object went into the index lately: a batch whose index query ran
        before that, and found neither its fetch nor its bytes in hand, reads it from the
        cache instead of fetching it again."""
        return self._writer.written_lately(cache_key)

    def all_in_hand(self, keys: list[str]) -> dict[str, InHand]:
        """:meth:`in_hand` for each of ``keys`` that has one (look before the index query)."""
        found = {}
        for key in keys:
            got = self.in_hand(key)
            if got is not None:
                found[key] = got
        return found

    @staticmethod
    async def shared(got: InHand | None) -> Blob | None:
        """The bytes ``got`` stands for (None if another batch's fetch failed or was
        stopped: the caller fetches the object itself, and sees its own error)."""
        if not isinstance(got, asyncio.Future):
            return got
        await asyncio.wait([got])
        return None if got.cancelled() else got.result()

    async def fetch(self, obj: ObjectInfo, cache_key: str) -> Blob:
        """Fetch ``obj``; one the cache admits is handed to the writer, and other batches
        share its fetch meanwhile."""
        if not self._admit(obj.key):
            return await self._fetcher.fetch(obj)
        shared = asyncio.get_running_loop().create_future()
        self._fetching[cache_key] = shared
        try:
            data = await self._fetcher.fetch(obj)
        except BaseException:
            shared.cancel()  # whoever waits fetches it itself
            raise
        finally:
            if self._fetching.get(cache_key) is shared:
                del self._fetching[cache_key]
        await self.store(obj.key, cache_key, data)  # held until written
        shared.set_result(data)
        return data

    async def store(self, key: str, cache_key: str, data: Blob, *, stored: bool = False) -> None:
        """Hand ``data`` to the writer; when it is full, wait for room (``wait_for_room``)
        or leave the object out of the cache this time (counted).  ``stored``: read from
        the cache, written again for its derived copies only."""
        if self._writer.full() and self._wait:
            await self._writer.room()
        if self._writer.full():
            self._counters.cache_store_skipped += 1
        else:
            self._writer.submit(key, cache_key, data, stored=stored)


class CacheFill:
    """The way into the SSD cache, for the pipeline and ``warm`` alike: one index thread
    (queries answer in the order they were asked, on one connection), one writer thread
    (fetched bytes appended to packs, indexed in batches; scaled copies derived there),
    and the fetch-once table over them (:class:`OnceFetcher`).

    Args:
        cache: The cache.
        fetcher: Sends the requests.
        counters: Counts objects the writer had no room for.
        admit: Whether the cache keeps an object (by its key).
        done: Called on the writer thread with the keys of each batch written (and the
            error, if the write failed).
        name: The index thread's name.
        derive: Copies to store beside an object (scaled JPEGs), made on the writer's side.
        derive_threads: Threads that derive them.
        remember: Cache keys the writer remembers having written (see
            :meth:`OnceFetcher.written_lately`).
        wait_for_room: See :class:`OnceFetcher`.
    """

    def __init__(
        self,
        cache: ObjectCache,
        fetcher: Fetcher,
        counters: Counters,
        *,
        admit: Callable[[str], bool],
        done: Callable[[list[str], Exception | None], None],
        name: str,
        derive: Callable[[Blob], list[tuple[str, bytes]]] | None = None,
        derive_threads: int = 1,
        remember: int = 0,
        wait_for_room: bool = False,
    ) -> None:
        self.cache = cache
        self.writer = CacheWriter(
            cache, done=done, derive=derive, derive_threads=derive_threads, remember=remember
        )
        self.index = IndexThread(cache, name)
        self.once = OnceFetcher(fetcher, self.writer, admit, counters, wait_for_room=wait_for_room)

    def close(self) -> None:
        """Write what the writer holds, then stop it and the index thread (blocks: call off
        the loop).  Idempotent."""
        try:
            self.writer.close()
        finally:
            self.index.close()
