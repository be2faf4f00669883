"""A store's object list through a cache folder: the listing saved there if young enough,
else listed (in parallel where the store can) and saved for the next run, once per node
(the processes of a node that share the folder take turns: :func:`listing_turn`); and the
metadata files (the root's and its folders') the same way (:func:`metadata_file`): each
kept on the node's disk with its ETag, fetched again only when the listing says it changed
(from a server that gives no ETag, fetched while it answers, and the kept copy read when
it does not)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial

import numpy as np

from .._base._errors import ObjectNotFound, TransientStoreError
from .._base._stats import Counters
from .._base._types import UNSIZED, ObjectInfo, ObjectStore
from .._stores._retry import counted_retrying
from ._metadata import Metadata, merge_metadata, metadata_objects, read_metadata
from ._objects import ObjectList, ObjectListBuilder
from ._saved import (
    ListingTurn,
    listing_path,
    load_listing,
    load_listing_made,
    load_metadata_copy,
    metadata_path,
    save_listing,
    save_metadata_copy,
)

__all__ = [
    "Asking",
    "complete_sizes",
    "list_and_save",
    "list_objects",
    "listing_turn",
    "metadata_file",
    "read_metadata_files",
    "saved_listing",
]

STATS_AT_ONCE = 32
"""Sizes asked at once of a store without a listing's own way to ask them (``stat``)."""

log = logging.getLogger("asyncloader")

Asking = Callable[[Sequence[str]], Awaitable[Sequence[ObjectInfo]]]
"""How the sizes and ETags of some keys of a listing are asked: each key's object, in order
(one the store does not have: size -1)."""


async def saved_listing(
    store: ObjectStore, folder: str | None, max_age: float, *, unsized: bool = False
) -> ObjectList | None:
    """The object list saved in the cache ``folder`` for the store's URL, if younger than
    ``max_age`` [seconds].  One that holds objects of sizes not asked yet (a filtered
    run's: :func:`complete_sizes`) only with ``unsized``: other readers list again, which
    sizes every object."""
    if folder is None or max_age <= 0:
        return None
    path = listing_path(folder, store.url)
    saved = await asyncio.to_thread(load_listing, path, store.url, max_age)
    if saved is not None and not unsized and bool((saved.sizes() == UNSIZED).any()):
        return None
    return saved


async def list_objects(store: ObjectStore, folder: str | None, max_age: float) -> ObjectList:
    """The store's object list, every object sized: the one saved in ``folder`` if young
    enough, else listed and saved for the next run, once per node (see
    :func:`listing_turn`)."""
    saved, turn = await listing_turn(store, folder, max_age)
    if saved is not None:
        return saved
    try:
        return await list_and_save(store, folder)
    finally:
        if turn is not None:
            turn.release()


async def list_and_save(
    store: ObjectStore, folder: str | None, *, unsized: bool = False
) -> ObjectList:
    """List ``store`` (in parallel where it can) and save the list in ``folder``.
    ``unsized``: where the store can, without asking the sizes its listing lacks (a web
    server's: :meth:`~asyncloader._stores._web.HttpStore.list_unsized`); the caller asks
    those it keeps (:func:`complete_sizes`)."""
    builder = ObjectListBuilder()
    list_unsized = getattr(store, "list_unsized", None) if unsized else None
    async for info in list_unsized() if list_unsized is not None else store.list():
        builder.add(info)
    objects = builder.build()
    if folder is not None:
        path = listing_path(folder, store.url)
        await asyncio.to_thread(save_listing, path, store.url, objects)
    return objects


async def complete_sizes(
    store: ObjectStore,
    folder: str | None,
    listed: ObjectList,
    keys: Iterable[str],
    ask: Asking | None = None,
) -> ObjectList:
    """``listed`` with the sizes and ETags of ``keys`` (those a run reads) asked of the
    store where it lists them as :data:`~asyncloader._base._types.UNSIZED`, and saved in
    ``folder`` again where the listing kept there is this one (as listed at the same time);
    the other objects keep theirs.  The processes of a node take turns
    (:class:`ListingTurn`): the first asks, the others find the sizes it saved.  ``ask``:
    how the sizes of some keys are asked (a run that reads the images' headers next asks
    for those with them); None: the store's ``stat_listed``, else a ``stat`` each."""
    at = _unsized(listed, keys)
    if not at:
        return listed
    path = listing_path(folder, store.url) if folder is not None else None
    turn = ListingTurn(path.with_suffix(".lock")) if path is not None else None
    made = None  # when the saved listing was made (None: there is none)
    same = True  # the saved listing is this one (or there is none): it takes the sizes
    if turn is not None:
        await turn.acquire()
    try:
        if path is not None:
            found = await asyncio.to_thread(load_listing_made, path, store.url)
            if found is not None:
                saved, made = found
                same = saved.keys() == listed.keys()
                if same:  # what another process of the node asked already
                    listed = listed.replaced((i, saved[i]) for i in at)
                    at = [i for i in at if listed[i].size == UNSIZED]
        if at:
            names = [listed[i].key for i in at]
            if ask is None:
                ask = getattr(store, "stat_listed", None) or partial(_stat_each, store)
            infos = await ask(names)
            listed = listed.replaced(zip(at, infos, strict=True))
            if path is not None and same:  # never over another (a newer) listing
                await asyncio.to_thread(save_listing, path, store.url, listed, made)
        return listed
    finally:
        if turn is not None:
            turn.release()


def _unsized(listed: ObjectList, keys: Iterable[str]) -> list[int]:
    """The places in ``listed`` of those of ``keys`` it lists as not sized yet."""
    unsized = np.flatnonzero(listed.sizes() == UNSIZED)
    if not len(unsized):
        return []
    wanted = set(keys)
    names = listed.keys()
    return [i for i in unsized.tolist() if names[i] in wanted]


async def _stat_each(store: ObjectStore, keys: Sequence[str]) -> list[ObjectInfo]:
    """Each key's ``stat``, :data:`STATS_AT_ONCE` at once (an object the store does not
    have: size -1, reported missing when read)."""
    out: list[ObjectInfo | None] = [None] * len(keys)
    left = iter(range(len(keys)))

    async def asker() -> None:
        for i in left:
            try:
                out[i] = await store.stat(keys[i])
            except ObjectNotFound:
                out[i] = ObjectInfo(keys[i], -1, "")

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(STATS_AT_ONCE, len(keys))):
                tg.create_task(asker())
    except* Exception as group:  # the first failure, as itself
        raise group.exceptions[0] from None
    return [o for o in out if o is not None]


async def listing_turn(
    store: ObjectStore, folder: str | None, max_age: float, *, unsized: bool = False
) -> tuple[ObjectList | None, ListingTurn | None]:
    """A saved listing young enough, or this process's turn to list.

    Processes of a node that start together on one cache folder take turns: the first to
    find no saved listing lists (the caller: then it saves and releases the turn), the
    others wait and read the listing it saved, even under ``max_age=0``
    (``refresh_listing``: it was made after they asked).  Returns ``(saved, None)`` or
    ``(None, turn)``; ``(None, None)`` without a folder.  ``unsized``: as
    :func:`saved_listing` takes it.
    """
    saved = await saved_listing(store, folder, max_age, unsized=unsized)
    if saved is not None or folder is None:
        return saved, None
    asked = time.time()
    turn = ListingTurn(listing_path(folder, store.url).with_suffix(".lock"))
    await turn.acquire()
    try:
        saved = await saved_listing(
            store, folder, max(max_age, time.time() - asked), unsized=unsized
        )
    except BaseException:
        turn.release()
        raise
    if saved is not None:
        turn.release()
        return saved, None
    return None, turn


async def metadata_file(
    store: ObjectStore, folder: str | None, obj: ObjectInfo, counters: Counters | None = None
) -> bytes:
    """The bytes of the metadata file ``obj`` (as listed: its key, size and ETag): the copy
    kept in the cache ``folder`` if it is of that ETag, else fetched (the store checks the
    ETag) and kept there for the next run and for the loaders of a run started offline.
    ``counters``: the request and its bytes, or the bytes read from the node's disk.

    A file listed without an ETag (a web server that gives none, such as Python's
    ``http.server``) cannot be checked by one: it is fetched whenever the store answers, and
    kept with its listed size; when the store does not answer (the node offline, as a warm
    cache allows), the kept copy of that size serves, with a warning.

    Raises:
        StoreError: the file could not be fetched (it changed since the listing, say), and
            no copy of it serves.
    """
    path = metadata_path(folder, store.url, obj.key) if folder is not None else None
    # What the kept copy must be of: the listed ETag, else the listed size.
    version = obj.etag or f"size {obj.size}"
    if path is not None and obj.etag:
        kept = await asyncio.to_thread(load_metadata_copy, path, version)
        if kept is not None:
            if counters is not None:
                counters.bytes_from_cache += len(kept)
            return kept
    try:
        data = bytes(await counted_retrying(partial(store.get, obj.key, etag=obj.etag), counters))
    except TransientStoreError:
        # Not answering after its retries: a copy no ETag can check is the one the node
        # kept when the store last answered, of the size the (saved) listing gives.
        kept = None
        if path is not None and not obj.etag:
            kept = await asyncio.to_thread(load_metadata_copy, path, version)
        if kept is None:
            raise
        log.warning(
            "asyncloader: %s does not answer; %s is read from the copy of its metadata file "
            "kept on this node (of the listed size: the server gives no ETag to check it by)",
            store.url,
            obj.key,
        )
        if counters is not None:
            counters.bytes_from_cache += len(kept)
        return kept
    if counters is not None:
        counters.bytes_fetched += len(data)
    if path is not None:
        await asyncio.to_thread(save_metadata_copy, path, version, data)
    return data


METADATA_READS = 16
"""Metadata files read at once (a dataset kept in many folders has one in each)."""


async def read_metadata_files(
    store: ObjectStore, folder: str | None, listed: ObjectList, counters: Counters | None
) -> Metadata | None:
    """The rows of every metadata file ``listed`` (:func:`~._metadata.metadata_objects`),
    each read through the cache ``folder`` (:func:`metadata_file`), as one
    table; None where there is none.

    Raises:
        StoreError: a file could not be read; ValueError: one that is malformed, or an
            image two of them name.
    """
    found = metadata_objects(listed)
    if not found:
        return None
    gate = asyncio.Semaphore(METADATA_READS)
    parts: list[Metadata | None] = [None] * len(found)

    async def one(i: int) -> None:
        async with gate:
            data = await metadata_file(store, folder, found[i], counters)
        parts[i] = await asyncio.to_thread(read_metadata, data, found[i].key)

    # The first file that fails stops the others' reads, and is the error raised.
    try:
        async with asyncio.TaskGroup() as tg:
            for i in range(len(found)):
                tg.create_task(one(i))
    except* Exception as group:
        raise group.exceptions[0] from None
    return merge_metadata([part for part in parts if part is not None])
