"""Images' headers, read for their pixel sizes (``_sizes`` says whose, and keeps what they
give): in the node's cache where it holds the image (:class:`CachedHeads`), else from the
store — one small range read per object (the first :data:`HEAD_BYTES`; a JPEG whose frame
header lies further, behind a large EXIF block, is read again to :data:`HEAD_MAX`; a PNG or
WebP whose orientation may follow its pixels, at its last :data:`HEAD_BYTES` too; an image
whose size or orientation these do not give, whole: see ``_imagesize``), many at once.
An image no larger than the first read came whole: where every image read stays a
sample (no filter on the sizes), the cache keeps it (:meth:`CachedHeads.keeper`, under the
cache's admission), so that the run's first epoch reads it from the node's disk instead of
fetching it a second time; under a filter on the sizes, only the images it keeps
(:data:`Stays`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from .._base._budget import InflightBudget
from .._base._errors import (
    AsyncLoaderError,
    DecodeError,
    IntegrityError,
    ObjectNotFound,
    not_listed,
    shown_key,
)
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore
from .._stores._retry import counted_retrying, in_slot
from ._imagesize import header_size, header_sizes

__all__ = [
    "HEAD_BYTES",
    "HEAD_MAX",
    "CachedHeads",
    "Keep",
    "Stays",
    "every_one",
    "read_headers",
]

HEAD_BYTES = 64 * 1024
"""Bytes of an object read for its header: a JPEG's frame header, a PNG's IHDR, a WebP's."""
HEAD_MAX = 1024 * 1024
"""Bytes read, at most, for a header beyond :data:`HEAD_BYTES` (a JPEG's EXIF thumbnail)."""
_WHOLE = 1 << 62
"""Bytes asked of the cache for a whole object (more than any holds)."""
log = logging.getLogger("asyncloader")

_Bytes = bytes | bytearray | memoryview
"""An object's bytes as a read returns them."""
_INFLIGHT = 64
"""Header reads in flight at once (each of a fixed set of readers)."""
_THE_IMAGE_S = (ObjectNotFound, IntegrityError, DecodeError)
"""The header read's failures that are the image's own: the ones ``"skip"`` counts."""
_KEEP_CHUNK = 8 * 1024 * 1024
"""Whole objects handed to the cache together [bytes]; at most two such hand-overs at once,
and header reads wait for them (what the pass holds in memory stays small)."""


Stays = Callable[[Sequence[str], Sequence[tuple[int, int]]], Sequence[bool]]
"""Which of the images of some keys, their headers' ``(height, width)`` read, are samples of
the run (a filter on ``width`` and ``height`` passes them): read whole, they are worth
caching.  Called on the keeping thread, once for each hand-over of images read whole (a
filter decided over many rows at once, off the event loop); it must not raise."""


def every_one(keys: Sequence[str], sizes: Sequence[tuple[int, int]]) -> list[bool]:
    """:data:`Stays` of a run without a filter on the sizes: every image read is a sample."""
    return [True] * len(keys)


@dataclass(frozen=True, slots=True)
class _Keeping:
    """What keeps the images that header reads fetched whole: ``keep`` (the cache's), of
    those that ``stays`` says are samples, every hand-over on ``thread``."""

    keep: Keep
    stays: Stays
    thread: Executor

    def __call__(self, items: Sequence[tuple[ObjectInfo, bytes, tuple[int, int]]]) -> int:
        """Keep those of ``items`` (each object, its bytes, its header's size) that stay
        samples; how many were kept (on :attr:`thread`)."""
        staying = self.stays([o.key for o, _, _ in items], [hw for _, _, hw in items])
        return self.keep([(o, d) for (o, d, _), s in zip(items, staying, strict=True) if s])


class Keep(Protocol):
    """Keeps whole objects in the node's cache (those its admission takes).  Blocking; every
    call on one thread, and :meth:`close` last, on that thread too (a cache's handles are
    its thread's: one pack file is appended to for the whole pass)."""

    def __call__(self, items: Sequence[tuple[ObjectInfo, bytes]]) -> int:
        """Keep ``items`` (each object with its bytes); how many were kept."""
        ...

    def close(self) -> None:
        """Close this thread's handles on the cache."""
        ...


class CachedHeads(Protocol):
    """The node's cache, as the header pass reads it (``_run``'s, over the SSD cache)."""

    @property
    def size_limit(self) -> int:
        """The bytes the cache holds at most."""
        ...

    def __call__(
        self, store: ObjectStore, objects: Sequence[ObjectInfo], n: int
    ) -> dict[int, bytes]:
        """The first ``n`` bytes of each of ``objects`` of ``store`` the cache holds, by
        their index in ``objects`` — none of them a request.  Blocking."""
        ...

    def keeper(self, store: ObjectStore, objects: Sequence[ObjectInfo]) -> Keep:
        """What keeps the whole objects that header reads of ``objects`` fetched, as a
        loader's fetches of them would be kept (its admission decided over ``objects``).
        Blocking."""
        ...


async def read_headers(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    counters: Counters | None,
    cached: CachedHeads | None,
    *,
    stays: Stays | None,
    upright: bool = False,
    held: Mapping[str, bytes] | None = None,
) -> tuple[dict[int, tuple[int, int]], dict[int, AsyncLoaderError]]:
    """The ``(height, width)`` of each of ``objects``, by index: read in the node's cache
    (``cached``) where it holds the object, else from the store; and the failures that are
    the images' own (every header is read, so that the caller can name the first).
    ``held``: the first bytes of some of them by key, fetched with their sizes (a web
    server's folder, sized by a GET of each image's first :data:`HEAD_BYTES`): the
    first read of those, made already.
    ``stays``: which of ``objects`` are samples of the run (:func:`every_one` where no
    filter on the sizes follows): those of them the first read fetched whole are kept in
    the cache; None: none is known to be one, none is kept.  ``upright``: the sizes of the
    images turned upright by their EXIF orientation (:func:`header_size`).

    Raises:
        StoreError: a fault the store's retries could not get past (not the image's).
    """
    found: dict[int, tuple[int, int]] = {}
    if cached is not None:
        found = await _cached_sizes(store, objects, cached, counters, upright)
    todo = [i for i in range(len(objects)) if i not in found]
    if not todo:
        return found, {}
    keeping = None
    if cached is not None and stays is not None:
        keep = await asyncio.to_thread(cached.keeper, store, objects)
        # Every hand-over on one thread of its own, which then closes its handles.
        thread = ThreadPoolExecutor(1, thread_name_prefix="asyncloader-keep")
        keeping = _Keeping(keep, stays, thread)
    try:
        # The reads go through an adaptive budget, as a fetcher's GETs do: a store that
        # throttles (a strict rate limiter) is paced, not hammered until retries end.
        budget = InflightBudget(_INFLIGHT, floor=1)
        read = partial(
            _read_header, store, counters=counters, upright=upright, held=held or {}, budget=budget
        )
        return await _read_all(objects, todo, found, read, counters, keeping)
    finally:
        if keeping is not None:
            keeping.thread.submit(keeping.keep.close)  # after the hand-overs still queued
            keeping.thread.shutdown(wait=False)


async def _read_all(
    objects: Sequence[ObjectInfo],
    todo: Sequence[int],
    found: dict[int, tuple[int, int]],
    read: Callable[[ObjectInfo], Awaitable[tuple[tuple[int, int], _Bytes]]],
    counters: Counters | None,
    keeping: _Keeping | None,
) -> tuple[dict[int, tuple[int, int]], dict[int, AsyncLoaderError]]:
    """:func:`read_headers`'s reads from the store (``read``: :func:`_read_header`'s):
    ``objects[todo]``'s headers into ``found``; those read whole handed to ``keeping``
    (which keeps the ones that stay samples), on its thread."""
    loop = asyncio.get_running_loop()
    unreadable: dict[int, AsyncLoaderError] = {}
    whole: list[tuple[ObjectInfo, bytes, tuple[int, int]]] = []
    held = 0  # bytes in `whole`
    handing = asyncio.Semaphore(2)

    async def hand_over(items: list[tuple[ObjectInfo, bytes, tuple[int, int]]]) -> None:
        assert keeping is not None
        async with handing:
            try:
                kept = await loop.run_in_executor(keeping.thread, keeping, items)
            except Exception as exc:  # the cache's disk, say: the epoch fetches them instead
                log.warning("asyncloader: images read whole for their headers not cached: %r", exc)
                return
        if counters is not None:
            counters.cache_stored += kept

    async def one(i: int) -> None:
        nonlocal whole, held
        obj = objects[i]
        try:
            found[i], data = await read(obj)
        except _THE_IMAGE_S as exc:
            unreadable[i] = exc
            return
        if keeping is None or len(data) != obj.size:
            return
        whole.append((obj, bytes(data), found[i]))
        held += len(data)
        if held >= _KEEP_CHUNK:
            items, whole, held = whole, [], 0
            await hand_over(items)

    # A fixed set of readers, each taking the next image: a task per image would hold a
    # million of them (and their memory) for a million images.
    left = iter(todo)

    async def reader() -> None:
        for i in left:
            await one(i)

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(_INFLIGHT, len(todo))):
                tg.create_task(reader())
    except* AsyncLoaderError as group:
        raise group.exceptions[0] from None
    if whole:
        await hand_over(whole)
    return found, unreadable


async def _read_header(
    store: ObjectStore,
    obj: ObjectInfo,
    *,
    counters: Counters | None,
    upright: bool,
    held: Mapping[str, bytes],
    budget: InflightBudget,
) -> tuple[tuple[int, int], bytes | bytearray | memoryview]:
    def attempt(start: int, end: int | None) -> Awaitable[_Bytes]:
        """One try of a read, holding a slot of ``budget``."""
        return in_slot(budget, partial(store.get, obj.key, start=start, end=end, etag=obj.etag))

    async def get(start: int, end: int | None) -> bytes | bytearray | memoryview:
        head = held.get(obj.key) if start == 0 else None
        if head is not None and (len(head) == obj.size or (end or obj.size) <= len(head)):
            # Whole (a server that sends the whole object to a range), as the store's
            # read would give it: the cache keeps it.
            data: _Bytes = head if len(head) == obj.size else memoryview(head)[:end]
            if counters is not None:  # the request that fetched it, made for this read
                counters.requests += 1
        else:
            data = await counted_retrying(partial(attempt, start, end), counters)
        if counters is not None:
            counters.bytes_fetched += len(data)
        return data

    if obj.size == -1:  # named by a metadata file, and the listing has no such object
        raise not_listed(store.url, obj.key)
    if obj.size == 0:  # a range of nothing is no request to make (a server answers 416)
        raise DecodeError(
            f"{shown_key(obj.key)}: an empty object (0 bytes), not an image; aspect-ratio "
            "buckets need each image's size",
            key=obj.key,
        )
    end: int | None = HEAD_BYTES
    while True:
        want = end if obj.size < 0 or end is None else min(end, obj.size)
        data = await get(0, want)
        whole = want is None or len(data) < want or len(data) == obj.size
        both = header_sizes(data, whole=whole)
        if upright and both is not None and both[1] is None and obj.size >= 2 * HEAD_BYTES:
            # Its orientation may follow the pixels: its last bytes, not the whole object.
            both = header_sizes(data, tail=await get(obj.size - HEAD_BYTES, obj.size))
        size = None if both is None else both[1 if upright else 0]
        if size is not None:
            return size, data
        if whole:
            raise DecodeError(
                f"{shown_key(obj.key)}: no image size in its {len(data)} bytes "
                "(not an image Pillow reads?); aspect-ratio buckets need each image's size",
                key=obj.key,
            )
        end = _further(data, end)


def _further(data: bytes | bytearray | memoryview, end: int | None) -> int | None:
    """How far to read an image whose first ``end`` bytes (``data``) did not give its size:
    a JPEG to :data:`HEAD_MAX` (its frame header lies behind its EXIF block, which may be
    large), then whole; any other image whole (a format Pillow opens only whole, or an
    orientation after the pixels: see ``_imagesize``)."""
    return HEAD_MAX if end == HEAD_BYTES and bytes(data[:2]) == b"\xff\xd8" else None


async def _cached_sizes(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    cached: CachedHeads,
    counters: Counters | None,
    upright: bool,
) -> dict[int, tuple[int, int]]:
    """The ``(height, width)`` of each of ``objects`` the node's cache holds, by index:
    from its first :data:`HEAD_BYTES` there, or as much more as :func:`_further` says, up to
    the whole object.  One whose header is not there is left to the store's read (which
    names what is wrong with it)."""
    out: dict[int, tuple[int, int]] = {}
    rounds: dict[int | None, list[int]] = {HEAD_BYTES: list(range(len(objects)))}
    while rounds:
        n, todo = rounds.popitem()
        heads = await asyncio.to_thread(
            cached, store, [objects[i] for i in todo], _WHOLE if n is None else n
        )
        for j, data in heads.items():
            if counters is not None:
                counters.bytes_from_cache += len(data)
            whole = n is None or len(data) < n
            size = header_size(data, upright, whole=whole)
            if size is not None:
                out[todo[j]] = size
            elif not whole:  # cut at n: its header may lie further
                rounds.setdefault(_further(data, n), []).append(todo[j])
    return out
