"""Single objects by where they are — a local path, a key beside the images, or a URL
(``s3://bucket/lists/train.npz``) — read and written whole: the manifests a job reads
instead of listing, and publishes next to the data (``ls --write-manifest URL``).

A URL under the run's store is read with that store; one elsewhere, with a store opened on
its folder (with the run's store options when it is on the same service).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from .._base._errors import StoreError, shown_key
from .._base._types import ObjectStore, WritableStore
from .._stores import HttpStore, LocalStore, lists_from_manifest, open_store, service_of
from .._stores._retry import retrying

__all__ = ["is_url", "object_at", "read_manifest_file", "write_file"]


def is_url(name: str) -> bool:
    """Whether ``name`` is a URL (``s3://``, ``https://``, ...) rather than a path or key
    (a one-letter scheme is a Windows drive)."""
    scheme, sep, _ = name.partition("://")
    return bool(sep) and len(scheme) > 1 and scheme.isalnum()


@contextlib.asynccontextmanager
async def object_at(
    store: ObjectStore, url: str, options: Mapping[str, Any] | None
) -> AsyncIterator[tuple[ObjectStore, str]]:
    """The store holding the object at ``url`` and its key there: ``store`` itself when the
    URL is under its root, else a store opened on the URL's folder with the run's store
    ``options`` (closed on leaving)."""
    if url.startswith(store.url):
        yield store, url[len(store.url) :]
        return
    folder, _, name = url.partition("?")[0].rpartition("/")
    if not name:
        raise ValueError(f"{url!r} names a folder, not an object")
    if lists_from_manifest(url):  # a web server's: the URL itself is the key (its query too)
        if isinstance(store, HttpStore):
            yield store, url
            return
        name = url
    # The run's options (endpoint, credentials) are for its own service only.
    try:
        same = service_of(url) == service_of(store.url)
    except ValueError:  # a store of the user's own (mem://, ...)
        same = False
    other = open_store(folder + "/", **(options if options and same else {}))
    try:
        yield other, name
    finally:
        await other.close()


async def read_manifest_file(
    store: ObjectStore, name: str, options: Mapping[str, Any] | None = None
) -> bytes | bytearray:
    """A manifest from a local file; else from a URL (``s3://bucket/train.npz``: under the
    store's root, or anywhere its ``options`` reach); else the object of that key beside
    the images."""
    if is_url(name):
        async with object_at(store, name, options) as (where, key):
            return await retrying(partial(where.get, key))
    if await asyncio.to_thread(os.path.exists, name):
        return await asyncio.to_thread(Path(name).read_bytes)
    return await retrying(partial(store.get, name))


async def write_file(
    store: ObjectStore, target: str, data: bytes, options: Mapping[str, Any] | None = None
) -> None:
    """Write ``data`` to ``target``: a URL (under the store's root, or anywhere its
    ``options`` reach; whole or not at all, as the store writes), else a local file
    (written beside it and renamed into place).

    Raises:
        StoreError: the store takes no writes (a plain web server), or refused this one.
    """
    if not is_url(target):
        path = Path(target)
        await LocalStore(path.parent).put(path.name, data)
        return
    async with object_at(store, target, options) as (where, key):
        if not isinstance(where, WritableStore):
            raise StoreError(
                f"cannot write {shown_key(target)}: {where.url} takes no uploads (write a "
                "local file and copy it there, or write to s3://, gs://, az:// or a folder)"
            )
        await where.put(key, data)
