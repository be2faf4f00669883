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

from .._base._errors import TransientStoreError
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore
from ._objects import ObjectList, ObjectListBuilder
from ._saved import (
    ListingTurn,
    listing_path,
    load_listing,
    load_metadata_copy,
    metadata_path,
    save_listing,
    save_metadata_copy,
)

__all__ = ["list_and_save", "list_objects", "listing_turn", "metadata_file", "saved_listing"]

log = logging.getLogger("asyncloader")


async def saved_listing(
    store: ObjectStore, folder: str | None, max_age: float
) -> ObjectList | None:
    """The object list saved in the cache ``folder`` for the store's URL, if younger than
    ``max_age`` [seconds]."""
    if folder is None or max_age <= 0:
        return None
    path = listing_path(folder, store.url)
    return await asyncio.to_thread(load_listing, path, store.url, max_age)


async def list_objects(store: ObjectStore, folder: str | None, max_age: float) -> ObjectList:
    """The store's object list: the one saved in ``folder`` if young enough, else listed
    and saved for the next run, once per node (see :func:`listing_turn`)."""
    saved, turn = await listing_turn(store, folder, max_age)
    if saved is not None:
        return saved
    try:
        return await list_and_save(store, folder)
    finally:
        if turn is not None:
            turn.release()


async def list_and_save(store: ObjectStore, folder: str | None) -> ObjectList:
    """List ``store`` (in parallel where it can) and save the list in ``folder``."""
    builder = ObjectListBuilder()
    async for info in store.list():
        builder.add(info)
    objects = builder.build()
    if folder is not None:
        path = listing_path(folder, store.url)
        await asyncio.to_thread(save_listing, path, store.url, objects)
    return objects


async def listing_turn(
    store: ObjectStore, folder: str | None, max_age: float
) -> tuple[ObjectList | None, ListingTurn | None]:
    """A saved listing young enough, or this process's turn to list.

    Processes of a node that start together on one cache folder take turns: the first to
    find no saved listing lists (the caller: then it saves and releases the turn), the
    others wait and read the listing it saved, even under ``max_age=0``
    (``refresh_listing``: it was made after they asked).  Returns ``(saved, None)`` or
    ``(None, turn)``; ``(None, None)`` without a folder.
    """
    saved = await saved_listing(store, folder, max_age)
    if saved is not None or folder is None:
        return saved, None
    asked = time.time()
    turn = ListingTurn(listing_path(folder, store.url).with_suffix(".lock"))
    await turn.acquire()
    try:
        saved = await saved_listing(store, folder, max(max_age, time.time() - asked))
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
        data = bytes(await store.get(obj.key, etag=obj.etag))
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
        counters.requests += 1
        counters.bytes_fetched += len(data)
    if path is not None:
        await asyncio.to_thread(save_metadata_copy, path, version, data)
    return data
