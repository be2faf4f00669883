"""Azure Blob Storage, spoken directly over HTTP.

The official ``azure-storage-blob`` aio client spends about 1.3 ms of CPU per small GET in
its pipeline (policies, request/response objects, deserialisers).  The Blob REST API needs
very little for what a loader does — List Blobs, Get Blob Properties, Get Blob with a range —
so this store builds those requests itself: SharedKey signing (one HMAC-SHA256), a SAS token
appended to the URL, or nothing for public containers.  Object GETs go out on the lean
HTTP/1.1 client, and so do listing pages, HEADs and PUTs (aiohttp only behind an
``https://`` proxy), retried on throttling with backoff.

Credentials, in order: the constructor's arguments (``credential=`` for Microsoft Entra
ID); ``AZURE_STORAGE_AUTH_MODE=login`` (Entra ID through ``DefaultAzureCredential``); a
connection string (argument or ``AZURE_STORAGE_CONNECTION_STRING``);
``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``; else
anonymous (public containers).  Entra ID bearer tokens come from ``azure-identity`` (the
``azure`` extra) and are refreshed ahead of expiry (:mod:`._bearer`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableSequence
from email.utils import formatdate
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlencode, urlsplit

from yarl import URL

from .._base._config import LIST_CONCURRENCY, READ_TIMEOUT
from .._base._errors import ObjectNotFound
from .._base._types import Blob, ObjectInfo
from ._azure_auth import (
    AzureCredentials,
    SharedKeySigner,
    entra_token_source,
    parse_connection_string,
)
from ._bearer import BearerToken, with_token
from ._http import gc_paused, normalize_etag, parse_xml, send
from ._http_objects import get_object, object_headers, object_info
from ._http_store import OriginStore
from ._listing import FolderListing, Page
from ._retry import retrying

__all__ = ["API_VERSION", "AzureStore", "azure_store_from_url", "parse_azure_url"]

T = TypeVar("T")

API_VERSION = "2024-11-04"
# Azure refuses an expired or revoked bearer token with 401 or 403 (AuthenticationFailed).
_REFUSED = (401, 403)
_BLOB_HOST = ".blob.core.windows.net"


def parse_azure_url(url: str, *, account: str | None = None) -> tuple[str | None, str, str, str]:
    """Split an Azure URL into ``(account, container, prefix, sas)``.

    * ``az://container/prefix`` when the account comes from ``account`` or the environment
      (``AZURE_STORAGE_ACCOUNT``, ``AZURE_STORAGE_CONNECTION_STRING``);
    * ``az://account/container/prefix`` otherwise, or when the first part is that account;
    * ``https://ACCOUNT.blob.core.windows.net/container/prefix[?SAS]``.

    Raises:
        ValueError: no container in the URL.
    """
    parts = urlsplit(url)
    sas = parts.query
    segments = unquote(parts.path).lstrip("/")
    if parts.scheme in ("http", "https"):
        host = parts.hostname or ""
        acct: str | None = host[: -len(_BLOB_HOST)] if host.endswith(_BLOB_HOST) else None
        container, _, prefix = segments.partition("/")
    else:
        known = account or os.environ.get("AZURE_STORAGE_ACCOUNT")
        if not known and os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
            cs = parse_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
            known = cs.get("accountname")
        if known and parts.netloc != known:
            acct, container, prefix = known, parts.netloc, segments
        else:
            acct = parts.netloc
            container, _, prefix = segments.partition("/")
    if not container:
        raise ValueError(f"an Azure URL needs a container: az://[account/]container/prefix ({url})")
    return acct, container, prefix, sas


class AzureStore(OriginStore, FolderListing):
    """An Azure Blob container (and name prefix) as an :class:`~asyncloader.ObjectStore`.

    Args:
        container: Container name.
        prefix: Blob name prefix of the dataset root ("train/"); keys are relative to it.
        account: Storage account name (else from the connection string or environment).
        account_key: The account's key (SharedKey signing).
        sas_token: A SAS token (query string), appended to every request.
        connection_string: An Azure Storage connection string (also read from
            ``AZURE_STORAGE_CONNECTION_STRING``); ``UseDevelopmentStorage=true`` is Azurite.
        endpoint_url: The Blob service URL, for emulators and sovereign clouds
            (``http://127.0.0.1:10000/devstoreaccount1``).
        anonymous: Send no credentials (public containers).
        credential: Microsoft Entra ID: an ``azure-identity`` credential (any object with
            ``get_token(scope)``), or ``"default"`` for ``DefaultAzureCredential``.
        ca_bundle: A PEM file of the CAs to trust for HTTPS instead of the system's.
            Default: ``REQUESTS_CA_BUNDLE``, else ``CURL_CA_BUNDLE`` (as the service's
            Python SDK reads them, through requests), else the system's CAs
            (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` where set).
        max_connections: Connection pool size for listing/HEAD (and GETs with aiohttp).
        read_timeout: Longest wait for an answer to start, and then between two reads
            of it: a stalled connection is abandoned (and the request retried), a slow but
            moving one is not [seconds].
        http_client: ``"lean"`` (default) or ``"aiohttp"`` (used anyway through a proxy
            spoken to over TLS, an ``https://`` one).
        list_concurrency: Sub-folders listed at once.
        page_size: Blobs per listing page (Azure allows up to 5000).
        proxy: The HTTP(S) proxy to go through (``http://[user:password@]host:port``;
            ``""``: none).  Default: the environment's (``HTTPS_PROXY``, ``HTTP_PROXY``,
            ``ALL_PROXY``, ``NO_PROXY``), as curl, requests and boto3 read it.
    """

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        account: str | None = None,
        account_key: str | None = None,
        sas_token: str | None = None,
        connection_string: str | None = None,
        endpoint_url: str | None = None,
        anonymous: bool = False,
        credential: Any = None,
        ca_bundle: str | None = None,
        max_connections: int = 64,
        read_timeout: float = READ_TIMEOUT,
        http_client: str = "lean",
        list_concurrency: int = LIST_CONCURRENCY,
        page_size: int = 5000,
        proxy: str | None = None,
    ) -> None:
        if not container:
            raise ValueError("an Azure URL needs a container: az://account/container/prefix")
        if not 1 <= page_size <= 5000:
            raise ValueError("page_size must be between 1 and 5000")
        self.creds = AzureCredentials.resolve(
            account,
            account_key=account_key,
            sas_token=sas_token,
            connection_string=connection_string,
            endpoint_url=endpoint_url,
            anonymous=anonymous,
            credential=credential,
        )
        self.container = container
        self.prefix = prefix
        self._signer = (
            SharedKeySigner(self.creds.account, self.creds.key) if self.creds.key else None
        )
        self._token: BearerToken | None = None
        self._sas = bool(self.creds.sas)
        self._sas_suffix = "?" + self.creds.sas if self.creds.sas else ""
        endpoint = URL(self.creds.endpoint)
        # Every request on the lean client (aiohttp through an https:// proxy).
        self._init_origin(
            f"{endpoint.scheme}://{endpoint.raw_authority}",
            http_client=http_client,
            max_connections=max_connections,
            read_timeout=read_timeout,
            ca_bundle=ca_bundle,
            proxy=proxy,
        )
        self._container_path = endpoint.raw_path.rstrip("/") + "/" + quote(container, safe="")
        self._list_concurrency = list_concurrency
        self._page_size = page_size
        self._date = ("", 0)

    @property
    def url(self) -> str:
        return f"az://{self.creds.account}/{self.container}/{self.prefix}"

    def _what(self, full: str) -> str:
        return f"az://{self.creds.account}/{self.container}/{full}"

    def _ensure(self) -> None:
        if self._open_clients() and self.creds.credential is not None and self._token is None:
            source, what = entra_token_source(self.creds.credential)
            self._token = BearerToken(source, what=what)

    def _headers(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        extra: Mapping[str, str] | None = None,
        authorization: str = "",
    ) -> dict[str, str]:
        """The request's headers, signed when there is a key or carrying ``authorization``
        (a bearer token) (``path`` percent-encoded, ``query`` the parameters other than a
        SAS token; lower-case header names)."""
        now = int(time.time())
        if self._date[1] != now:  # formatdate costs more than the HMAC
            self._date = (formatdate(now, usegmt=True), now)
        headers = {"x-ms-date": self._date[0], "x-ms-version": API_VERSION}
        if extra:
            headers.update(extra)
        if self._signer is not None:
            self._signer.sign(method, path, query, headers)
        elif authorization:
            headers["authorization"] = authorization
        return headers

    def _target(self, path: str, query: Mapping[str, str]) -> str:
        """The request target: ``path`` (encoded) and the query, with the SAS token."""
        qs = urlencode(query, quote_via=quote)
        if self._sas_suffix:
            qs = f"{qs}&{self.creds.sas}" if qs else self.creds.sas or ""
        return f"{path}{'?' + qs if qs else ''}"

    async def _control(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        *,
        what: str,
        key: str | None,
        parse: Callable[[Blob], T],
        extra: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> tuple[Mapping[str, str], T]:
        """A listing, HEAD or PUT request (``extra`` headers, lower-case, and ``body``),
        retried on throttling and transient failures; the answer's body goes through
        ``parse`` inside each try (a listing page cut short is retried)."""
        self._ensure()

        async def once(authorization: str) -> tuple[Mapping[str, str], T]:
            headers = self._headers(method, path, query, extra, authorization)
            try:
                answer, got = await send(
                    self._lean,
                    self._session,
                    self._origin,
                    method,
                    self._target(path, query),
                    headers,
                    what=what,
                    key=key or "",
                    body=body,
                )
                return answer, parse(got)
            except ObjectNotFound as exc:
                if self._signer is None and not self._sas and not authorization:
                    exc.add_note(
                        "no credentials were sent: Azure answers 404 to anonymous "
                        "requests for private containers (Microsoft Entra ID: "
                        "AZURE_STORAGE_AUTH_MODE=login or credential=)"
                    )
                raise

        return await retrying(partial(with_token, self._token, once, refused=_REFUSED))

    async def _ready(self) -> None:
        self._ensure()

    async def _list_pages(
        self, full: str, folders: MutableSequence[str] | None
    ) -> AsyncIterator[Page]:
        cut = len(self.prefix)
        marker = ""
        while True:
            query = {
                "comp": "list",
                "maxresults": str(self._page_size),
                "prefix": full,
                "restype": "container",
            }
            if folders is not None:
                query["delimiter"] = "/"
            if marker:
                query["marker"] = marker
            what = self._what(full)
            _, (page, prefixes, marker) = await self._control(
                "GET",
                self._container_path,
                query,
                what=what,
                key=full,
                parse=partial(_listing_page, cut=cut, what=what, key=full),
            )
            if folders is not None:
                folders.extend(prefixes)
            yield page
            if not marker:
                return

    def _blob_path(self, full: str) -> str:
        return self._container_path + "/" + quote(full, safe="/~")

    async def stat(self, key: str) -> ObjectInfo:
        full = self.prefix + key
        headers, _ = await self._control(
            "HEAD", self._blob_path(full), {}, what=self._what(full), key=key, parse=bytes
        )
        return object_info(key, headers, what=self._what(full))

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        if self._session is None and self._lean is None:
            self._ensure()
        full = self.prefix + key
        path = self._blob_path(full)
        # SharedKey signs both (lower-case names: the signer's canonical form).
        wanted = {
            k.lower(): v
            for k, v in object_headers(start, end, etag, range_name="x-ms-range").items()
        }

        async def once(authorization: str) -> Blob:
            headers = self._headers("GET", path, {}, wanted, authorization)
            return await get_object(
                self._lean,
                self._session,
                self._origin,
                path + self._sas_suffix,
                headers,
                what=self._what(full),
                key=key,
                start=start,
                end=end,
                etag=etag,
            )

        return await with_token(self._token, once, refused=_REFUSED)

    async def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the blob ``key`` (a Put Blob of a block blob, replacing any blob
        there), with its MD5, so that a body changed on the way is refused; retried on
        throttling and transient failures."""
        full = self.prefix + key
        extra = {
            "content-length": str(len(data)),
            "content-md5": base64.b64encode(hashlib.md5(data).digest()).decode(),
            "content-type": "application/octet-stream",
            "x-ms-blob-type": "BlockBlob",
        }
        answer, _ = await self._control(
            "PUT",
            self._blob_path(full),
            {},
            what=self._what(full),
            key=key,
            parse=bytes,
            extra=extra,
            body=data,
        )
        return ObjectInfo(key, len(data), normalize_etag(answer.get("etag", "")))

    def _take_tokens(self) -> list[BearerToken | None]:
        tokens, self._token = [self._token], None
        return tokens


def azure_store_from_url(url: str, **options: Any) -> AzureStore:
    """The store for an ``az://`` or ``https://ACCOUNT.blob.core.windows.net/`` URL."""
    known = options.get("account")
    if not known and options.get("connection_string"):
        known = parse_connection_string(options["connection_string"]).get("accountname")
    account, container, prefix, sas = parse_azure_url(url, account=known)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if account:
        options.setdefault("account", account)
    if sas:
        options.setdefault("sas_token", sas)
    return AzureStore(container, prefix, **options)


def _listing_page(body: Blob, *, cut: int, what: str, key: str) -> tuple[Page, list[str], str]:
    """One List Blobs page: its objects, its sub-folders (``BlobPrefix``) and the next
    marker ("" on the last page).  Raises TransientStoreError on a page cut short."""
    with gc_paused():  # (see there) from the tree to the objects, and the tree dropped
        root = parse_xml(body, what=what, key=key)
        blobs = root.find("Blobs")
        page: Page = []
        prefixes: list[str] = []
        if blobs is not None:
            prefixes = [p.findtext("Name") or "" for p in blobs.iterfind("BlobPrefix")]
            for blob in blobs.iterfind("Blob"):
                name = blob.findtext("Name") or ""
                props = blob.find("Properties")
                if props is None or name.endswith("/"):
                    continue
                if props.findtext("ResourceType") == "directory":
                    continue  # hierarchical-namespace folders
                size = int(props.findtext("Content-Length") or 0)
                etag = normalize_etag(props.findtext("Etag") or "")
                page.append(ObjectInfo(name[cut:], size, etag))
        marker = root.findtext("NextMarker") or ""
        del root, blobs
    return page, prefixes, marker
