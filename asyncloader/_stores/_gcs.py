"""Google Cloud Storage, spoken directly over its JSON API.

A loader needs three calls — list objects, get an object's metadata, download an object or
a byte range — so this store builds them itself and sends every one on the lean HTTP/1.1
client (aiohttp behind an ``https://`` proxy), as the S3 and Azure stores do: one bearer token in a
header, no per-request client machinery.

* Versions: an object's *generation* is its version (``ObjectInfo.etag``).  A download asks
  for that generation (``ifGenerationMatch``, answered 412 when the object was replaced)
  and checks the ``x-goog-generation`` of the answer (emulators ignore the precondition).
* Credentials (:mod:`._gcs_auth`): Application Default Credentials, a credentials file or
  object, or none (``anonymous=True``, and by default against an emulator named by
  ``STORAGE_EMULATOR_HOST``).  Tokens are refreshed ahead of expiry (:mod:`._bearer`).
* Listing: delimited pages of up to 1000 objects, sub-folders listed in parallel in sorted
  chunks, a long flat run of names by name ranges side by side (``startOffset``;
  :mod:`._listing`), JSON parsed with the collector paused.
* ``user_project=``: the project billed for a requester-pays bucket.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from yarl import URL

from .._base._config import LIST_CONCURRENCY, READ_TIMEOUT
from .._base._errors import (
    AccessDenied,
    ObjectNotFound,
    StoreError,
    TransientStoreError,
)
from .._base._types import Blob, ObjectInfo
from ._bearer import BearerToken, with_token
from ._gcs_auth import READ_WRITE_SCOPE, emulator_host, google_token_source
from ._http import gc_paused, send
from ._http_objects import get_object, object_headers
from ._http_store import OriginStore
from ._listing import Page, RangedListing
from ._retry import retrying

__all__ = ["GCS_ENDPOINT", "GCSStore", "gcs_store_from_url", "parse_gcs_url"]

T = TypeVar("T")

GCS_ENDPOINT = "https://storage.googleapis.com"
_FIELDS = "items(name,size,generation),prefixes,nextPageToken"


def parse_gcs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/some/prefix/`` → ``("bucket", "some/prefix/")``."""
    parts = urlsplit(url)
    return parts.netloc, parts.path.lstrip("/")


class GCSStore(OriginStore, RangedListing):
    """A Google Cloud Storage bucket (and name prefix) as an :class:`~asyncloader.ObjectStore`.

    Args:
        bucket: Bucket name.
        prefix: Object name prefix of the dataset root ("train/"); keys are relative to it.
        endpoint_url: The service's base URL, for emulators and private endpoints.  Default:
            ``STORAGE_EMULATOR_HOST`` when set, else ``https://storage.googleapis.com``.
        anonymous: Send no credentials (public buckets).  Default: anonymous against the
            emulator of ``STORAGE_EMULATOR_HOST``, else credentials are required.
        credentials: A ``google.auth.credentials.Credentials`` to use.
        credentials_file: A credentials file (service-account key, or any file that
            Application Default Credentials reads) instead of ADC.
        user_project: The project billed for requests to a requester-pays bucket.
        max_connections: Connection pool size with aiohttp (``http_client="aiohttp"``).
        read_timeout: Longest wait for an answer to start, and then between two reads of it:
            a stalled connection is abandoned and the request retried [seconds].
        http_client: ``"lean"`` (default) or ``"aiohttp"`` (used anyway through a proxy
            spoken to over TLS, an ``https://`` one).
        list_concurrency: Sub-folders listed at once.
        page_size: Objects per listing page (GCS allows up to 1000).
        ca_bundle: A PEM file of the CAs to trust for HTTPS instead of the system's.
            Default: ``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE`` (as the service's
            Python SDK reads them, through requests), else the system's CAs
            (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` where set).
        proxy: The HTTP(S) proxy to go through (``http://[user:password@]host:port``;
            ``""``: none).  Default: the environment's (``HTTPS_PROXY``, ``HTTP_PROXY``,
            ``ALL_PROXY``, ``NO_PROXY``), as curl, requests and boto3 read it.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        anonymous: bool | None = None,
        credentials: Any = None,
        credentials_file: str | None = None,
        user_project: str | None = None,
        max_connections: int = 256,
        read_timeout: float = READ_TIMEOUT,
        http_client: str = "lean",
        list_concurrency: int = LIST_CONCURRENCY,
        page_size: int = 1000,
        ca_bundle: str | None = None,
        proxy: str | None = None,
    ) -> None:
        if not bucket:
            raise ValueError("a GCS URL needs a bucket: gs://bucket/prefix/")
        if not 1 <= page_size <= 1000:
            raise ValueError("page_size must be between 1 and 1000")
        emulator = emulator_host()
        endpoint = (endpoint_url or emulator or GCS_ENDPOINT).rstrip("/")
        if anonymous is None:
            given = credentials is not None or credentials_file is not None
            anonymous = not given and endpoint_url is None and emulator is not None
        if anonymous and (credentials is not None or credentials_file is not None):
            raise ValueError("anonymous=True and credentials are contradictory")
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        self.anonymous = anonymous
        self._credentials = credentials
        self._credentials_file = credentials_file
        self._user_project = user_project
        self._billing = f"&userProject={quote(user_project, safe='')}" if user_project else ""
        base = URL(endpoint)
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"endpoint_url must be an http(s) URL, not {endpoint!r}")
        self._init_origin(
            f"{base.scheme}://{base.raw_authority}",
            http_client=http_client,
            max_connections=max_connections,
            read_timeout=read_timeout,
            ca_bundle=ca_bundle,
            proxy=proxy,
        )
        root = base.raw_path.rstrip("/")
        quoted = quote(bucket, safe="")
        self._meta_path = f"{root}/storage/v1/b/{quoted}/o"
        self._media_path = f"{root}/download/storage/v1/b/{quoted}/o"
        self._upload_path = f"{root}/upload/storage/v1/b/{quoted}/o"
        self._list_concurrency = list_concurrency
        self._page_size = page_size
        self._token: BearerToken | None = None
        self._write_token: BearerToken | None = None  # made on the first put

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def _what(self, full: str) -> str:
        return f"gs://{self.bucket}/{full}"

    def _ensure(self) -> None:
        if self._open_clients() and not self.anonymous and self._token is None:
            source, what = google_token_source(self._credentials, self._credentials_file)
            self._token = BearerToken(source, what=what)

    def _query(self, params: dict[str, str]) -> str:
        if self._user_project:
            params = {**params, "userProject": self._user_project}
        return urlencode(params, quote_via=quote, safe="/") if params else ""

    async def _control(
        self,
        target: str,
        *,
        what: str,
        key: str,
        parse: Callable[[Blob], T],
        method: str = "GET",
        body: bytes | None = None,
        token: BearerToken | None = None,
    ) -> T:
        """A metadata or listing GET (or an upload's POST of ``body``, with ``token``: one
        that may write), retried on throttling and transient failures; the JSON answer goes
        through ``parse`` inside each try (one cut short is asked again)."""
        self._ensure()
        token = token or self._token
        kind = {"content-type": "application/octet-stream"} if body is not None else {}

        async def once(authorization: str) -> T:
            headers = {**kind, "authorization": authorization} if authorization else kind
            try:
                _, answer = await send(
                    self._lean,
                    self._session,
                    self._origin,
                    method,
                    target,
                    headers,
                    what=what,
                    key=key,
                    body=body,
                )
            except ObjectNotFound as exc:
                if token is None:
                    exc.add_note(
                        "no credentials were sent: a private bucket may answer 404 or 401 "
                        "to anonymous requests"
                    )
                raise
            return parse(answer)

        return await retrying(partial(with_token, token, once))

    async def _ready(self) -> None:
        self._ensure()

    async def _page(
        self, full: str, delimited: bool, start_after: str, token: str | None
    ) -> tuple[Page, list[str], str | None]:
        """One page of objects.list (a :data:`PageFetch`): continuing with ``token``, or
        starting after the name ``start_after`` (``startOffset`` is inclusive: that name
        itself, listed by the range before, is dropped)."""
        params = {"prefix": full, "maxResults": str(self._page_size), "fields": _FIELDS}
        if delimited:
            params["delimiter"] = "/"
        if token is not None:
            params["pageToken"] = token
        elif start_after:
            params["startOffset"] = start_after
        what = self._what(full)
        cut = len(self.prefix)
        page, prefixes, next_token = await self._control(
            f"{self._meta_path}?{self._query(params)}",
            what=what,
            key=full,
            parse=partial(_listing_page, cut=cut, what=what, key=full),
        )
        if token is None and start_after:  # (a prefix met again, ranged_pages drops)
            page = [o for o in page if o.key != start_after[cut:]]
        return page, prefixes, next_token or None

    async def stat(self, key: str) -> ObjectInfo:
        full = self.prefix + key
        what = self._what(full)
        target = f"{self._meta_path}/{quote(full, safe='')}?" + self._query(
            {"fields": "size,generation"}
        )
        meta = await self._control(
            target, what=what, key=key, parse=partial(_json, what=what, key=key)
        )
        if "size" not in meta:
            raise StoreError(f"{what}: the metadata gave no size", key=key)
        return ObjectInfo(key, int(meta["size"]), str(meta.get("generation", "")))

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        if self._lean is None and self._session is None:
            self._ensure()
        full = self.prefix + key
        target = f"{self._media_path}/{quote(full, safe='')}?alt=media{self._billing}"
        if etag:
            target += f"&ifGenerationMatch={etag}"
        rng = object_headers(start, end, "")  # the range; the version goes in the query

        async def once(authorization: str) -> Blob:
            headers = {**rng, "authorization": authorization} if authorization else rng
            return await get_object(
                self._lean,
                self._session,
                self._origin,
                target,
                headers,
                what=self._what(full),
                key=key,
                start=start,
                end=end,
                etag=etag,
                version_header="x-goog-generation",
            )

        return await with_token(self._token, once)

    async def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the object ``key`` (a media upload, replacing any object there);
        the MD5 the service reports is checked against the bytes sent, and an upload that
        arrived changed is sent again, as are throttled and failed ones."""
        full = self.prefix + key
        what = self._what(full)
        params = {"uploadType": "media", "name": full, "fields": "size,generation,md5Hash"}
        target = f"{self._upload_path}?{self._query(params)}"
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()

        def check(body: Blob) -> dict[str, Any]:
            meta = _json(body, what=what, key=key)
            if meta.get("md5Hash", md5) != md5 or int(meta.get("size", len(data))) != len(data):
                raise TransientStoreError(f"{what}: the upload arrived changed", key=key)
            return meta

        self._ensure()
        if not self.anonymous and self._write_token is None:
            source, who = google_token_source(
                self._credentials, self._credentials_file, scope=READ_WRITE_SCOPE
            )
            self._write_token = BearerToken(source, what=who)
        try:
            meta = await self._control(
                target,
                what=what,
                key=key,
                parse=check,
                method="POST",
                body=data,
                token=self._write_token,
            )
        except AccessDenied as exc:
            if self._write_token is not None:
                exc.add_note(
                    f"the upload's token was asked for the scope {READ_WRITE_SCOPE}; the "
                    "credentials also need a role that may create objects in the bucket "
                    "(roles/storage.objectCreator, or objectAdmin to replace one)"
                )
            raise
        return ObjectInfo(key, len(data), str(meta.get("generation", "")))

    def _take_tokens(self) -> list[BearerToken | None]:
        tokens = [self._token, self._write_token]
        self._token = self._write_token = None
        return tokens


def gcs_store_from_url(url: str, **options: Any) -> GCSStore:
    """The store for a ``gs://bucket/prefix/`` URL."""
    bucket, prefix = parse_gcs_url(url)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return GCSStore(bucket, prefix, **options)


def _json(body: Blob, *, what: str, key: str) -> dict[str, Any]:
    """A JSON answer; one cut short on the way is a transient failure (retried)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TransientStoreError(
            f"unreadable answer for {what} ({len(body)} bytes; cut short?)", key=key
        ) from exc
    if not isinstance(value, dict):
        raise StoreError(f"unexpected answer for {what}: not a JSON object", key=key)
    return value


def _listing_page(body: Blob, *, cut: int, what: str, key: str) -> tuple[Page, list[str], str]:
    """One objects.list page: its objects, its sub-folders and the next page token ("" on
    the last page)."""
    with gc_paused():  # (see there) many small dicts made and dropped
        doc = _json(body, what=what, key=key)
        page: Page = [
            ObjectInfo(
                item["name"][cut:], int(item.get("size", 0)), str(item.get("generation", ""))
            )
            for item in doc.get("items", ())
            if not item["name"].endswith("/")  # folder placeholder objects
        ]
        prefixes = list(doc.get("prefixes", ()))
        token = str(doc.get("nextPageToken") or "")
        del doc
    return page, prefixes, token
