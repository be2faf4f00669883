"""Objects at plain HTTP(S) URLs, named by a manifest (a web server or CDN has no listing).

The manifest (JSONL or CSV, see :mod:`asyncloader._base._manifest`) names each object by a key
relative to the base URL or by an absolute URL, optionally with its ``size`` and ``etag``.
Without one, a caption folder's own metadata file at the base URL (``metadata.jsonl``,
``.csv`` or ``.parquet``, Hugging Face's ``imagefolder``) names its images, by ``file_name``;
without that either, the server's folder pages (nginx's ``autoindex``, Caddy's, lighttpd's,
Express's ``serve-index``, ``http.server``: walked by :mod:`._web_walk`, read by
:mod:`._web_index`) list the folder and the folders below it, as ``fsspec`` reads them;
objects without a size are HEAD-requested once when listing (a saved listing in the cache
then spares that on later runs), or, listed by a loader (:meth:`HttpStore.list_unsized`),
only those it keeps: an image that ``filters=`` leaves out is never asked for (a loader
that reads the images' headers next asks a GET of each one's first bytes instead, which
gives both: :meth:`HttpStore.stat_listed_heads`).  GETs use
``Range`` and check the answer's length and ETag (weakly, without ``If-Match``, which a
server's weak ETag never matches), so a changed object cannot pass.  A server that sends no
ETag (``http.server``) versions its objects by their ``Last-Modified``, checked the same
way; a file that the folder pages size is versioned by the time they say it was last
modified (:mod:`._http_objects`): a file replaced by one of the same size is then another
object to the cache, not its old bytes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote, urlsplit

from yarl import URL

from .._base._budget import InflightBudget
from .._base._config import READ_TIMEOUT
from .._base._errors import ObjectNotFound, StoreError, shown_key
from .._base._manifest import METADATA_NAMES, file_key, metadata_rows, read_manifest
from .._base._types import UNSIZED, Blob, ObjectInfo
from ._http import (
    MAX_REDIRECTS,
    REQUESTS_CA_NAMES,
    Redirected,
    ca_bundle_for,
    make_session,
    normalize_etag,
    proxy_for,
    redirected,
    send,
)
from ._http_objects import (
    answer_version,
    decoded,
    get_object,
    object_headers,
    object_info,
    parse_content_range,
    version_check,
)
from ._http_store import HTTPStoreBase, use_lean_client
from ._lean_http import LeanHTTPClient, tls_context
from ._retry import in_slot, retrying
from ._routes import with_login
from ._tunnel import lean_route

if TYPE_CHECKING:
    import aiohttp

__all__ = ["HttpStore"]

log = logging.getLogger("asyncloader")
T = TypeVar("T")


class HttpStore(HTTPStoreBase):
    """Objects under an ``http(s)://`` base URL as an :class:`~asyncloader.ObjectStore`.

    Args:
        base_url: Keys are resolved against it (``https://host/data/`` + ``cat/1.jpg``).  A
            query string on it (a signed token) is sent with every request and never shown.
        manifest: The object list: a local file, or a URL or key relative to ``base_url``.
            Without it, the listing is the folder's metadata file and the images its
            ``file_name`` column names (the first of ``metadata.jsonl``, ``.csv``,
            ``.parquet`` the server has at ``base_url``), or, without one, the files its
            folder pages link below ``base_url`` (nginx's ``autoindex``, ``python -m
            http.server``), or, without those, an error; ``stat``/``get`` work either way.
        headers: Extra headers for every request (``Authorization``: never shown or logged).
        max_connections: Connection pool size for HEADs (and GETs with aiohttp).
        read_timeout: Longest wait for an answer to start, and then between two reads
            of it: a stalled connection is abandoned (and the request retried), a slow but
            moving one is not [seconds].
        http_client: ``"lean"`` (default) or ``"aiohttp"`` (used anyway through a proxy
            spoken to over TLS, an ``https://`` one).
        head_concurrency: HEAD requests at once while listing objects of unknown size.
        ca_bundle: A PEM file of the CAs to trust for HTTPS instead of the system's (a
            private CA).  Default: ``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE`` (as
            requests reads them), else the system's CAs (``SSL_CERT_FILE`` /
            ``SSL_CERT_DIR`` where set, as Python's own ``ssl`` reads them).
        proxy: The HTTP(S) proxy to go through (``http://[user:password@]host:port``;
            ``""``: none).  Default: the environment's (``HTTPS_PROXY``, ``HTTP_PROXY``,
            ``ALL_PROXY``, ``NO_PROXY``), as curl, requests and boto3 read it.
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
        ca_bundle: str | None = None,
        proxy: str | None = None,
    ) -> None:
        use_lean = use_lean_client(http_client)
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.netloc}{parts.path}")
        path = parts.path if parts.path.endswith("/") else parts.path + "/"
        # Credentials in the URL (https://user:password@host/) are sent as Basic, as curl
        # and requests send them, and kept out of the URL: the store's URL keys the cache
        # and names objects in messages, and a password is neither.
        self._base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{path}"
        self._query = parts.query
        self._manifest = manifest
        self._headers = with_login(dict(headers or {}), parts.username, parts.password)
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._use_lean = use_lean
        self._head_concurrency = head_concurrency
        self._heads_budget: InflightBudget | None = None  # stat_listed_heads's, made once
        self._ca_bundle = ca_bundle_for(ca_bundle, *REQUESTS_CA_NAMES)
        self._tls: ssl.SSLContext | None = None  # made on first use
        self._proxy = proxy
        # aiohttp sessions by the proxy they go through (None: direct).
        self._sessions: dict[str | None, aiohttp.ClientSession] = {}
        # Lean clients by origin (None: its requests are aiohttp's, through its proxy).
        self._lean: dict[tuple[str, str, int], LeanHTTPClient | None] = {}
        self._vias: dict[tuple[str, str | None, int | None], str | None] = {}
        # The metadata file a listing read whole, by key: its ETag and bytes, for the
        # first whole read of it (the dataset's) to take instead of fetching it again.
        self._listed_files: dict[str, tuple[str, Blob]] = {}
        self._closed = False

    @property
    def url(self) -> str:
        return self._base

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context(self._ca_bundle)
        return self._tls

    def _via(self, url: URL) -> str | None:
        """The proxy requests to ``url``'s origin go through (None: direct), decided once
        per origin: the environment read for each request (twice a GET) was a few percent
        of a GET's CPU."""
        origin = (url.scheme, url.host, url.port)
        if origin not in self._vias:
            self._vias[origin] = proxy_for(str(url.origin()), self._proxy)
        return self._vias[origin]

    def _session_for(self, url: URL) -> aiohttp.ClientSession:
        """The aiohttp session for ``url``: through its proxy, if one is on the way."""
        self._check_open()
        via = self._via(url)
        session = self._sessions.get(via)
        if session is None:
            session = make_session(
                self._max_connections,
                read_timeout=self._read_timeout,
                ssl_context=self._tls_context(),
                proxy=via,
            )
            self._sessions[via] = session
        return session

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
            return await self._metadata_listing()
        name = os.fspath(self._manifest)
        if "://" not in name and await asyncio.to_thread(os.path.isfile, name):
            data: Blob = await asyncio.to_thread(Path(name).read_bytes)
        else:
            data = await self._served(name, text=True)
        return read_manifest(data, name)

    async def _served(self, name: str, *, text: bool) -> Blob:
        """The file ``name`` (a key under the base URL, or a URL) as served, its
        ``Content-Encoding`` undone; ``text``: as UTF-8 (see :func:`_as_utf8`).

        Raises:
            ObjectNotFound: the server has no such file (404).
        """
        answer, data, _ = await self._page(name, shown_key(name))
        return _as_utf8(data, answer) if text else data

    async def _page(
        self, name: str, what: str, accept: str | None = None
    ) -> tuple[Mapping[str, str], Blob, str]:
        """A GET of ``name`` (a key under the base URL, or a URL), retried as every read
        is: the answer's headers, its body (``Content-Encoding`` undone) and the URL it
        came from (another where the server redirected it); ``what`` names it in errors;
        ``accept``: the request's ``Accept`` (unless the store's own headers set one).

        Raises:
            ObjectNotFound: 404.  AccessDenied: 401, 403.
        """
        extra = {}
        if accept is not None and not any(h.lower() == "accept" for h in self._headers):
            extra["Accept"] = accept
        answer, body, landed = await retrying(
            lambda: self._ask("GET", name, extra, what=what, key=None)
        )
        return answer, decoded(body, answer, what=what, key=None), str(landed)

    async def _metadata_listing(self) -> list[dict[str, str]]:
        """Without a manifest, the rows of the folder's metadata file (Hugging Face's
        ``imagefolder``: the first of :data:`METADATA_NAMES` the server has at the base
        URL): the file itself, and each image its ``file_name`` column names.

        Raises:
            StoreError: the server has none of them.
        """
        for name in METADATA_NAMES:
            try:
                answer, body, _ = await self._page(name, shown_key(name))
            except ObjectNotFound:
                continue
            data = body if name.endswith(".parquet") else _as_utf8(body, answer)
            rows = await asyncio.to_thread(metadata_rows, data, name)
            # Named as the dataset names them (relative to the root); a row without a
            # file_name is the dataset's to refuse, naming its line, when it reads the file.
            names = (r.get("file_name") for _, r in rows)
            keys = [file_key(n) for n in names if isinstance(n, str) and n]
            rest = ({"key": k} for k in dict.fromkeys(keys) if k != name)
            return [self._listed_file(name, answer, body), *rest]
        listed = await self._index_listing()
        if listed is not None:
            return listed
        raise StoreError(
            f"{self._base} has no listing: no {', '.join(METADATA_NAMES)} at its root to "
            "name its images, and no folder page of links there (nginx's autoindex, "
            "python -m http.server): name its objects with a manifest (the store option "
            "manifest='train.jsonl': a loader's StoreConfig(options={'manifest': "
            "'train.jsonl'}), warm's and ls's store_options=; or labels='train.jsonl')"
        )

    def _listed_file(self, key: str, answer: Mapping[str, str], body: Blob) -> dict[str, str]:
        """The listing's row of the file ``key`` it read whole (``answer``: the GET's
        headers): where the answer is the file as stored (no ``Content-Encoding``, its
        ``Content-Length`` the body's), with its size and ETag (no HEAD), and kept for the
        first whole read of it (:meth:`get`); else the key alone."""
        encoding = answer.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity") or answer.get("content-length") != str(len(body)):
            return {"key": key}
        etag = answer_version(answer)
        self._listed_files[key] = (etag, body)
        return {"key": key, "size": str(len(body)), "etag": etag}

    async def _index_listing(self) -> list[dict[str, str]] | None:
        """Without a manifest or a metadata file, the server's folder pages, walked down
        (:class:`~._web_walk.FolderWalk`); None where the base URL's page is not one."""
        # Imported here: a store read by a manifest or a metadata file (an engine's, say)
        # never pays for the pages' parser.
        from ._web_walk import FolderWalk

        return await FolderWalk(self._page, self._base, self._head_concurrency).listing()

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        """The manifest's objects under ``prefix``; sizes not in it are HEAD-requested (an
        object the server does not have is listed with size -1)."""
        rows = [r for r in await self._read_manifest() if r["key"].startswith(prefix)]
        async for obj in self._infos(rows, lambda _: True):
            yield obj

    async def list_unsized(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """:meth:`list` without its HEADs: an object whose size the manifest does not give
        is listed with size :data:`~asyncloader._base._types.UNSIZED`, for the caller to
        ask with :meth:`stat_listed` once it knows which it keeps (a filter leaves the
        others unasked).  Metadata files are asked at once: they are read first."""
        rows = [r for r in await self._read_manifest() if r["key"].startswith(prefix)]
        async for obj in self._infos(rows, lambda key: key.rpartition("/")[2] in METADATA_NAMES):
            yield obj

    async def stat_listed(self, keys: Sequence[str]) -> Sequence[ObjectInfo]:
        """The size and ETag of each of ``keys`` as :meth:`list` gives them (HEADs at once
        through the listing's budget; an object the server does not have: size -1)."""
        return [obj async for obj in self._infos([{"key": k} for k in keys], lambda _: True)]

    async def _infos(
        self, rows: Sequence[Mapping[str, str]], ask: Callable[[str], bool]
    ) -> AsyncIterator[ObjectInfo]:
        """Each row's object: its size and ETag from the row, else from a HEAD where
        ``ask(key)``, else of size :data:`UNSIZED`."""
        # The HEADs go through an adaptive budget of their own, as a fetcher's GETs do: a
        # server that throttles (a rate limiter) is paced, not hammered until retries end.
        budget = InflightBudget(self._head_concurrency, floor=1)

        async def info(row: Mapping[str, str]) -> ObjectInfo:
            key = row["key"]
            if "size" in row:
                return ObjectInfo(key, int(row["size"]), normalize_etag(row.get("etag", "")))
            if not ask(key):
                return ObjectInfo(key, UNSIZED, "")
            try:
                return (await retrying(lambda: self._sized(key, budget)))[0]
            except ObjectNotFound:
                # Listed as of unknown size: the loader then reports it missing (an
                # error, or a counted skip) like any object that vanished.
                return ObjectInfo(key, -1, "")

        # Bounded batches keep a million-row manifest from creating a million tasks.
        for i in range(0, len(rows), 4096):
            for obj in await asyncio.gather(*(info(r) for r in rows[i : i + 4096])):
                yield obj

    async def stat(self, key: str) -> ObjectInfo:
        """The object's size and ETag from a HEAD; where the answer gives no length (a
        chunked answer, a server that refuses HEAD), from a GET of its first byte (its
        ``Content-Range`` holds the size)."""
        return (await retrying(lambda: self._sized(key)))[0]

    async def stat_listed_heads(
        self, keys: Sequence[str], n: int
    ) -> Sequence[tuple[ObjectInfo, Blob]]:
        """:meth:`stat_listed` for a run that reads each object's first ``n`` bytes next
        (an image's header): each of ``keys``'s size and ETag from a GET of those bytes
        instead of a HEAD, with the bytes (the whole object where it is no larger); an
        object the server does not have: size -1, no bytes.  All at once through a
        budget kept from one call to the next: the caller asks a bounded number of keys at
        a time, and a rate limiter's pace, once learned, holds for the next ones."""
        if self._heads_budget is None:
            self._heads_budget = InflightBudget(self._head_concurrency, floor=1)
        budget = self._heads_budget

        async def one(key: str) -> tuple[ObjectInfo, Blob]:
            try:
                return await retrying(lambda: self._sized(key, budget, n))
            except ObjectNotFound:
                return ObjectInfo(key, -1, ""), b""

        return await asyncio.gather(*(one(k) for k in keys))

    async def _sized(
        self, key: str, budget: InflightBudget | None = None, head: int = 0
    ) -> tuple[ObjectInfo, Blob]:
        """One try of :meth:`stat` (``head``: of :meth:`stat_listed_heads`, the bytes to
        read), holding a slot of ``budget`` (if any) while asking."""
        if budget is None:
            return await self._size_of(key, head)
        return await in_slot(budget, partial(self._size_of, key, head))

    async def _size_of(self, key: str, head: int = 0) -> tuple[ObjectInfo, Blob]:
        """The object's size and ETag from a HEAD, else (``head`` bytes asked, or a server
        that refuses HEAD or gives no length) from a GET of its first bytes, with them."""
        what = self._what(key)
        if not head:
            try:
                headers, _, _ = await self._ask("HEAD", key, {}, what=what, key=key)
                if "content-length" in headers:
                    info = object_info(key, headers, what=what)
                    return ObjectInfo(key, info.size, answer_version(headers)), b""
            except StoreError as exc:
                if exc.status not in (405, 501):  # HEAD not allowed: ask by GET
                    raise
        first = object_headers(0, max(head, 1), "")
        headers, body, _ = await self._ask("GET", key, first, what=what, key=key)
        span = headers.get("content-range")
        total = parse_content_range(span)[2] if span else len(body)  # a 200: the whole
        if total is None:
            raise StoreError(f"{what}: the server gives no size for it", key=key)
        return ObjectInfo(key, total, answer_version(headers)), body

    async def _ask(
        self, method: str, name: str, extra: Mapping[str, str], *, what: str, key: str | None
    ) -> tuple[Mapping[str, str], Blob, URL]:
        """One request for ``name`` (a key under the base URL, or a URL) with the store's
        headers and ``extra``: on its origin's lean client where there is one, as the
        objects' GETs go (so a server that closes every connection is asked a few at a
        time, by one gate), else on aiohttp; the lean client's redirects followed here, as
        aiohttp follows its own.  The answer's headers and body, and the URL it came from.
        ``key``: what errors name (None: a page, not an object)."""
        url, headers = self._addressed(name)
        headers.update(extra)
        landed: list[URL] = []  # where aiohttp's own redirects took it

        def ask(
            lean: LeanHTTPClient | None,
            session: aiohttp.ClientSession,
            base: str,
            target: str,
            headers: dict[str, str],
        ) -> Awaitable[tuple[Mapping[str, str], Blob]]:
            return send(
                lean, session, base, method, target, headers, what=what, key=key, landed=landed
            )

        (answer, body), url = await self._following(url, headers, ask, what=what, key=key)
        return answer, body, landed[-1] if landed else url

    async def _following(
        self,
        url: URL,
        headers: dict[str, str],
        ask: Callable[
            [LeanHTTPClient | None, aiohttp.ClientSession, str, str, dict[str, str]],
            Awaitable[T],
        ],
        *,
        what: str,
        key: str | None,
    ) -> tuple[T, URL]:
        """``ask(lean client, session, base, target, headers)`` for ``url``, and where the
        lean client is answered with a redirect (aiohttp follows its own), again where it
        goes (:func:`~._routes.redirected`: credentials kept to the same origin); the
        answer and the URL that gave it."""
        for _ in range(MAX_REDIRECTS):
            base = f"{url.scheme}://{url.raw_authority}"
            try:
                lean, session = self._lean_client(url), self._session_for(url)
                return await ask(lean, session, base, url.raw_path_qs, headers), url
            except Redirected as moved:
                url, headers = redirected(url, moved.location, headers)
        raise StoreError(f"{what}: still redirected after {MAX_REDIRECTS} requests", key=key)

    def _addressed(self, key: str) -> tuple[URL, dict[str, str]]:
        """Where ``key`` is asked, and the store's headers for it (a copy): an absolute key
        with credentials in its URL sends them as Basic ``Authorization``, as the base's."""
        url = self._target(key)
        headers = dict(self._headers)
        if url.user is not None:
            headers = with_login(headers, url.raw_user, url.raw_password)
            url = url.with_user(None)
        return url, headers

    def _lean_client(self, url: URL) -> LeanHTTPClient | None:
        """The lean client of ``url``'s origin (through the proxy on the way, if any), or
        None where aiohttp takes the request (``http_client="aiohttp"``, or a proxy the
        lean client does not speak to: :meth:`._tunnel.Proxy.of`)."""
        if not self._use_lean:
            return None
        assert url.host is not None
        assert url.port is not None
        origin = (url.scheme, url.host, url.port)
        if origin in self._lean:  # decided once per origin, as its proxy is
            return self._lean[origin]
        speaks, proxy = lean_route(self._via(url))
        client = None
        if speaks:
            tls = self._tls_context() if url.scheme == "https" else None
            client = LeanHTTPClient(
                *origin,
                read_timeout=self._read_timeout,
                ssl_context=tls,
                proxy=proxy,
                cautious=True,  # a web server may close every connection: see its docs
            )
        self._lean[origin] = client
        return client

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        listed = self._listed_files.get(key) if start == 0 and end is None else None
        if listed is not None and etag in ("", listed[0]):
            del self._listed_files[key]
            return listed[1]  # the listing read it whole a moment ago: that answer
        url, headers = self._addressed(key)
        what = self._what(key)
        # No If-Match: a web server's ETag may be weak (Apache's for a file changed within
        # the second, nginx's for an answer it compressed), and a weak one never matches
        # If-Match, so an unchanged object would be answered 412.  The answer's own ETag
        # is compared instead (get_object), weakly: a changed object still cannot pass.
        # A server without ETags: its Last-Modified, where the listing took the version
        # from it (version_check).
        headers = {**headers, **object_headers(start, end, "")}
        expect, header = version_check(etag)
        read = partial(
            get_object, what=what, key=key, start=start, end=end, etag=expect, version_header=header
        )
        data, _ = await self._following(url, headers, read, what=what, key=key)
        return data

    async def close(self) -> None:
        self._closed = True
        self._listed_files.clear()
        sessions, self._sessions = self._sessions, {}
        lean, self._lean = self._lean, {}
        for session in sessions.values():
            await session.close()
        for client in lean.values():
            if client is not None:
                await client.close()


def _as_utf8(data: Blob, headers: Mapping[str, str]) -> Blob:
    """A served manifest's text as UTF-8: decoded as its ``Content-Type`` labels it (a
    ``charset=`` other than UTF-8), else taken as UTF-8 (what JSONL is)."""
    ctype = headers.get("content-type", "")
    charset = ""
    for param in ctype.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    if charset in ("", "utf-8", "utf8", "us-ascii", "ascii"):
        return data
    try:
        return bytes(data).decode(charset).encode("utf-8")
    except (LookupError, UnicodeDecodeError) as exc:
        raise StoreError(
            f"a manifest labelled {ctype!r} that does not decode as such: {exc}"
        ) from exc
