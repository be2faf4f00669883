"""Several stores as one (a loader of several sources): an object's key is its URL.

A key is the URL of its source (the source's store's ``url``) followed by the object's key
there: ``s3://a/train/cat/1.jpg``.  Each request goes to the source's own store; the SSD
cache keys each object as that store does (:meth:`MixedStore.part`), so a source warmed or
read on its own and the same source in a mix share their entries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from .._base._errors import ObjectNotFound, shown_key
from .._base._types import Blob, ObjectInfo, ObjectStore

__all__ = ["MixedStore"]


class MixedStore:
    """The stores of several sources, one request surface (see the module's docstring)."""

    def __init__(self, stores: Sequence[ObjectStore]) -> None:
        self.stores = list(stores)
        self._by_length = sorted(self.stores, key=lambda s: len(s.url), reverse=True)

    @property
    def url(self) -> str:
        """Every source's URL, joined by `` + `` (names the mix in messages)."""
        return " + ".join(s.url for s in self.stores)

    def part(self, key: str) -> tuple[ObjectStore, str]:
        """The store of the object ``key`` names, and its key there.

        Raises:
            ObjectNotFound: a key under none of the sources.
        """
        for store in self._by_length:  # a source inside another's folder: the deeper one
            if key.startswith(store.url):
                return store, key[len(store.url) :]
        raise ObjectNotFound(f"{shown_key(key)} is under none of the sources ({self.url})")

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Every object of every source, keyed by its URL (``prefix``: a URL prefix)."""
        for store in self.stores:
            async for obj in store.list():
                key = store.url + obj.key
                if key.startswith(prefix):
                    yield ObjectInfo(key, obj.size, obj.etag)

    async def stat(self, key: str) -> ObjectInfo:
        store, rel = self.part(key)
        info = await store.stat(rel)
        return ObjectInfo(key, info.size, info.etag)

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        store, rel = self.part(key)
        return await store.get(rel, start=start, end=end, etag=etag)

    async def close(self) -> None:
        for store in self.stores:
            await store.close()
