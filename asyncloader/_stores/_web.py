"""Objects at plain HTTP(S) URLs, named by a manifest (a web server or CDN has no listing).

The manifest (JSONL or CSV, see :mod:`asyncloader._base._manifest`) names each object by a key
relative to the base URL or by an absolute URL, optionally with its ``size`` and ``etag``;
objects without a size are HEAD-requested once when listing (a saved listing in the cache
then spares that on later runs).  GETs use ``Range`` and ``If-Match`` and check the answer's
length and ETag, so a server that ignores ``If-Match`` still cannot pass a changed object.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from yarl import URL

from .._base._config import READ_TIMEOUT
from .._base._errors import ObjectNotFound, StoreError, shown_key
from .._base._manifest import read_manifest
from .._base._types import Blob, ObjectInfo
from ._http import (
    get_object,
    make_session,
    normalize_etag,
    object_headers,
    object_info,
    request,
)
from ._http_store import HTTPStoreBase, use_lean_client
from ._lean_http import LeanHTTPClient
from ._retry import retrying

if TYPE_CHECKING:
    import aiohttp

__all__ = ["HttpStore"]


class HttpStore(HTTPStoreBase):
    """Objects under an ``http(s)://`` base URL as an :class:`~asyncloader.ObjectStore`.

    Args:
        base_url: Keys are resolved against it (``https://host/data/`` + ``cat/1.jpg``).  A
            query string on it (a signed token) is sent with every request and never shown.
        manifest: The object list: a local file, or a URL or key relative to ``base_url``.
            Required to list; ``stat``/``get`` work without it.
        headers: Extra headers for every request (``Authorization``: never shown or logged).
        max_connections: Connection pool size for HEADs (and GETs with aiohttp).
        read_timeout: Longest wait for an answer to start, and then between two reads
            of it: a stalled connection is abandoned (and the request retried), a slow but
            moving one is not [seconds].
        http_client: ``"lean"`` (default) or ``"aiohttp"`` (used anyway behind a proxy).
        head_concurrency: HEAD requests at once while listing objects of unknown size.
    """

    def __init__(
        self,
        base_url: str,
        *,
        manifest: str | os.PathLike[str] | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 64,
        read_timeout: float = READ_TIMEOUT,
        http_client: str = "lean",
        head_concurrency: int = 32,
    ) -> None:
        use_lean = use_lean_client(http_client)
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.netloc}{parts.path}")
        path = parts.path if parts.path.endswith("/") else parts.path + "/"
        self._base = f"{parts.scheme}://{parts.netloc}{path}"
        self._query = parts.query
        self._manifest = manifest
        self._headers = dict(headers or {})
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._use_lean = use_lean
        self._head_concurrency = head_concurrency
        self._session: aiohttp.ClientSession | None = None
        self._lean: dict[tuple[str, str, int], LeanHTTPClient] = {}
        self._closed = False

    @property
    def url(self) -> str:
        return self._base

    def _session_or_open(self) -> aiohttp.ClientSession:
        self._check_open()
        if self._session is None:
            self._session = make_session(self._max_connections, read_timeout=self._read_timeout)
        return self._session

    def _target(self, key: str) -> URL:
        """The object's URL: ``key`` itself when absolute, else below the base URL."""
        raw = key if "://" in key else self._base + quote(key, safe="/~")
        if self._query:
            raw += ("&" if "?" in raw else "?") + self._query
        return URL(raw, encoded=True)

    def _what(self, key: str) -> str:
        """The object as messages name it (an absolute key's query, a credential, hidden)."""
        return shown_key(key) if "://" in key else self._base + key

    async def _read_manifest(self) -> list[dict[str, str]]:
        if self._manifest is None:
            raise StoreError(
                f"{self._base} has no listing: name its objects with a manifest "
                "(the store option manifest='train.jsonl': a loader's "
                "StoreConfig(options={'manifest': 'train.jsonl'}), warm's and ls's "
                "store_options=; or labels='train.jsonl')"
            )
        name = os.fspath(self._manifest)
        if "://" not in name and await asyncio.to_thread(os.path.isfile, name):
            data: bytes = await asyncio.to_thread(Path(name).read_bytes)
        else:
            session = self._session_or_open()
            _, data = await retrying(
                lambda: request(
                    session,
                    "GET",
                    self._target(name),
                    self._headers,
                    what=shown_key(name),
                    key=None,
                )
            )
        return read_manifest(data, name)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        """The manifest's objects under ``prefix``; sizes not in it are HEAD-requested (an
        object the server does not have is listed with size -1)."""
        rows = [r for r in await self._read_manifest() if r["key"].startswith(prefix)]
        sem = asyncio.Semaphore(self._head_concurrency)

        async def info(row: dict[str, str]) -> ObjectInfo:
            key = row["key"]
            if "size" in row:
                return ObjectInfo(key, int(row["size"]), normalize_etag(row.get("etag", "")))
            async with sem:
                try:
                    return await self.stat(key)
                except ObjectNotFound:
                    # Listed as of unknown size: the loader then reports it missing (an
                    # error, or a counted skip) like any object that vanished.
                    return ObjectInfo(key, -1, "")

        # Bounded batches keep a million-row manifest from creating a million tasks.
        for i in range(0, len(rows), 4096):
            for obj in await asyncio.gather(*(info(r) for r in rows[i : i + 4096])):
                yield obj

    async def stat(self, key: str) -> ObjectInfo:
        session = self._session_or_open()
        headers, _ = await retrying(
            lambda: request(
                session, "HEAD", self._target(key), self._headers, what=self._what(key), key=key
            )
        )
        return object_info(key, headers, what=self._what(key))

    def _lean_client(self, url: URL) -> LeanHTTPClient:
        assert url.host is not None
        assert url.port is not None
        origin = (url.scheme, url.host, url.port)
        client = self._lean.get(origin)
        if client is None:
            client = LeanHTTPClient(*origin, read_timeout=self._read_timeout)
            self._lean[origin] = client
        return client

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        session = self._session_or_open()
        url = self._target(key)
        headers = {**self._headers, **object_headers(start, end, etag)}
        return await get_object(
            self._lean_client(url) if self._use_lean else None,
            session,
            f"{url.scheme}://{url.raw_authority}",
            url.raw_path_qs,
            headers,
            what=self._what(key),
            key=key,
            start=start,
            end=end,
            etag=etag,
        )

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        lean, self._lean = self._lean, {}
        if session is not None:
            await session.close()
        for client in lean.values():
            await client.close()
