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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from .._base._config import RunConfig
from .._base._stats import Counters
from .._base._types import Blob, CachedAt, ObjectInfo, ObjectStore, Sample
from .._cache import IndexThread, ObjectCache
from .._cache._admission import ADMIT_ALL, admission, admitted
from .._cache._writer import CacheWriter
from .._dataset import Listing
from .._dataset._headers import Keep
from .._decode import scaled_copies as scaled_jpeg_copies
from .._decode import scaled_footprint
from .._fetch import Fetcher
from .._stores._mixed import MixedStore
from ._sampler import epoch_indices, node_subset

__all__ = [
    "Admission",
    "CacheFill",
    "CacheHeads",
    "InHand",
    "OnceFetcher",
    "node_admission",
    "objects_admission",
    "node_objects",
]

InHand = Blob | asyncio.Future[Blob]
"""An object's bytes waiting to be written, or its fetch in flight."""


def entry_key(store: ObjectStore, key: str, etag: str) -> str:
    """The cache key of ``key`` of ``store``: an object of several sources' mix
    (:class:`~asyncloader._stores._mixed.MixedStore`) is keyed as its own source's store
    keys it, so that a source read alone and in a mix share their entries."""
    if isinstance(store, MixedStore):
        source, key = store.part(key)
        return ObjectCache.entry_key(source.url, key, etag)
    return ObjectCache.entry_key(store.url, key, etag)


class CacheHeads:
    """The node's SSD cache as the header pass reads it (``_dataset._headers.CachedHeads``):
    the first bytes of each object it holds, under the key the loader's fetches keep it by
    (a cache that a run without buckets, or an interrupted ``warm``, filled gives a bucketed
    run its images' sizes, and the run starts with the store unreachable).  ``scaled``: the
    cache keeps large JPEGs' scaled copies (``CacheConfig.scaled_jpegs``), which count in
    its admission."""

    def __init__(self, cache: ObjectCache, *, scaled: bool = False) -> None:
        self.cache = cache
        self.scaled = scaled

    @property
    def size_limit(self) -> int:
        """The bytes the cache holds at most."""
        return self.cache.size_limit

    def __call__(
        self, store: ObjectStore, objects: Sequence[ObjectInfo], n: int
    ) -> dict[int, bytes]:
        keys = [entry_key(store, o.key, o.etag) for o in objects]
        try:
            found = self.cache.heads(keys, n)
        finally:
            self.cache.close()  # this thread's handle: a worker thread of the caller's loop
        return {i: found[k] for i, k in enumerate(keys) if k in found}

    def keeper(self, store: ObjectStore, objects: Sequence[ObjectInfo]) -> Keep:
        """Keeps whole objects the header reads of ``objects`` fetched, as the loader's
        fetches would: those the cache's admission over ``objects`` takes (a cache too small
        for them keeps a subset of what a node's loader keeps, which decides over the
        node's part of them), with no scaled copies (they are smaller than a header read,
        far below a copy's least size)."""
        limit = self.cache.size_limit
        threshold, _ = objects_admission(objects, limit, scaled=self.scaled)
        return _Keeper(self.cache, store, threshold)


class _Keeper:
    """:meth:`CacheHeads.keeper`'s: one pack file appended to by the calls (all on one
    thread), until :meth:`close` on that thread."""

    def __init__(self, cache: ObjectCache, store: ObjectStore, threshold: int) -> None:
        self.cache, self.store, self.threshold = cache, store, threshold

    def __call__(self, items: Sequence[tuple[ObjectInfo, bytes]]) -> int:
        taken = [(o, data) for o, data in items if admitted(o.key, self.threshold)]
        self.cache.put_many([(entry_key(self.store, o.key, o.etag), d) for o, d in taken])
        return len(taken)

    def close(self) -> None:
        self.cache.close()  # this thread's index handle and pack


def node_objects(objects: Sequence[ObjectInfo], run: RunConfig) -> Sequence[ObjectInfo]:
    """The objects of ``objects`` that the loaders of this process's node read over the
    epochs of ``run`` (the node: ``local_world_size`` consecutive ranks; all of them where
    that is not known).

    Shuffled globally, every object; node-local, the node's subset (:func:`node_subset`);
    unshuffled, its ranks' fixed shards, dealt as :func:`epoch_indices` deals them.
    """
    world = run.world_size
    local = min(run.shard.local_world_size or world, world)
    node = run.rank // local
    if run.shuffle == "node":
        if run.shard.local_world_size is None:
            return objects
        mine = node_subset(len(objects), seed=run.seed, node=node, nodes=max(world // local, 1))
    elif run.shuffle:
        return objects
    else:
        shards = [
            epoch_indices(
                len(objects), seed=run.seed, epoch=0, shuffle=False, rank=r, world_size=world
            )
            for r in range(node * local, min(node * local + local, world))
        ]
        mine = np.unique(np.concatenate(shards)) if shards else np.zeros(0, np.int64)
    return [objects[int(i)] for i in mine]


def node_admission(
    objects: Sequence[ObjectInfo], run: RunConfig, size_limit: int, *, scaled: bool
) -> tuple[int, float]:
    """The one admission rule, for the loader and ``warm`` alike: the threshold of a cache
    of ``size_limit`` bytes for the objects this node reads (:func:`node_objects`), and the
    share of their bytes it keeps (see :func:`~asyncloader._cache._admission.admission`).

    With ``scaled`` copies each large JPEG counts with them (``warm --scaled-jpegs`` and
    ``CacheConfig(scaled_jpegs=True)`` alike).
    """
    return objects_admission(node_objects(objects, run), size_limit, scaled=scaled)


def objects_admission(
    objects: Iterable[ObjectInfo], size_limit: int, *, scaled: bool
) -> tuple[int, float]:
    """:func:`node_admission` over ``objects`` as given (the header pass's: every object
    whose header it reads, a superset of what any node reads, so it admits a subset)."""
    footprint = scaled_footprint if scaled else int
    return admission(((o.key, footprint(o.size)) for o in objects), size_limit)


class Admission:
    """Which objects a loader's cache keeps: :func:`node_admission` of its listing, worked
    out once the listing is complete (everything is admitted while it grows).

    Args:
        listing: The loader's samples.
        run: Its order and shard.
        cache: The cache (its size limit).
        scaled: Scaled copies count with their objects.
        counters: Where the share kept is said (``cache_share``).
    """

    def __init__(
        self, listing: Listing, run: RunConfig, cache: ObjectCache, scaled: bool, counters: Counters
    ) -> None:
        self._listing = listing
        self._run = run
        self._cache = cache
        self._scaled = scaled
        self._counters = counters
        self._threshold: int | None = None

    @property
    def known(self) -> bool:
        return self._threshold is not None

    def threshold(self) -> int:
        """The threshold (a hash per key the first time: ~1.5 s a million keys)."""
        if self._threshold is None:
            dataset = self._listing.dataset
            if dataset is None:
                return ADMIT_ALL
            objects = [s.obj for s in dataset.samples]
            # A mix's shards move over the epochs (each source's draws): every object counts.
            run = self._run if dataset.mix is None else replace(self._run, shuffle=True)
            self._threshold, self._counters.cache_share = node_admission(
                objects, run, self._cache.size_limit, scaled=self._scaled
            )
        return self._threshold

    def __call__(self, key: str) -> bool:
        return admitted(key, self.threshold())


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
        self.index = IndexThread(cache.close, name)
        self.once = OnceFetcher(fetcher, self.writer, admit, counters, wait_for_room=wait_for_room)
        self.admission: Admission | None = None  # the loader's (for_loader)

    @classmethod
    def for_loader(
        cls,
        cache: ObjectCache,
        fetcher: Fetcher,
        counters: Counters,
        listing: Listing,
        run: RunConfig,
        *,
        scaled_copies: bool,
        max_pixels: int,
        remember: int,
    ) -> CacheFill:
        """A loader's way into the cache: what it keeps by :func:`node_admission`, what
        was written counted (``cache_stored``, ``cache_store_failed``), scaled copies of
        large JPEGs derived on the writer's side where asked.

        Fetched bytes go to the cache off the decode path, written in batches by one
        thread; when the disk falls behind (``CacheWriter.full``), objects are not cached
        this time (counted), rather than slowing the epoch down.  The batches' index
        queries run off the loop on one thread: they answer in the order the batches
        started, so their fetches start in that order too (several threads let a later
        batch's requests go ahead of an earlier one's), on one connection.
        """

        def written(keys: list[str], error: Exception | None) -> None:
            # On the writer thread; it alone changes these two counters.
            if error is None:
                counters.cache_stored += len(keys)
            else:
                counters.cache_store_failed += len(keys)

        admission = Admission(listing, run, cache, scaled_copies, counters)
        fill = cls(
            cache,
            fetcher,
            counters,
            admit=admission,
            done=written,
            name="asyncloader-index",
            derive=partial(scaled_jpeg_copies, max_pixels=max_pixels) if scaled_copies else None,
            remember=remember,
        )
        fill.admission = admission
        return fill

    async def look_up(
        self, store: ObjectStore, batch: Sequence[Sample]
    ) -> tuple[list[str], dict[str, InHand], dict[str, CachedAt | None]]:
        """A batch's one index query, off the loop and in batch order: the cache keys of
        its samples, what of them is being fetched or waits to be written (looked at
        *before* the query: see the module's docstring), and where the cache has the rest
        (the decode workers read those places without another query)."""
        keys = [entry_key(store, s.obj.key, s.obj.etag) for s in batch]
        early = self.once.all_in_hand(keys)
        return keys, early, await self.index.run(self.cache.locate, keys)

    async def prepare(self) -> None:
        """Before an epoch: the writer has written what it held (a restarted epoch reads
        those objects from disk), and the admission is known once the listing is (a hash
        per key: off the loop)."""
        await self.writer.drain()
        admission = self.admission
        if admission is not None and not admission.known:
            await asyncio.to_thread(admission.threshold)

    def close(self) -> None:
        """Write what the writer holds, then stop it and the index thread (blocks: call off
        the loop).  Idempotent."""
        try:
            self.writer.close()
        finally:
            self.index.close()
