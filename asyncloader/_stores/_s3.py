"""Amazon S3 (and S3-compatible) store.

Endpoints, regions, profiles and credential sources resolve through aiobotocore, exactly
as in every other AWS tool (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, env vars, instance roles,
SSO, ...).  Every request — GET of an object or a byte range, listing pages, HEAD for stat —
is a plain HTTP request on one shared client, signed by our lean SigV4 signer with a cached
signing key: botocore's per-request machinery costs several times the CPU of the HTTP
itself, its listing parser about 0.3 ms per key, and its loggers print the session token,
the ``Authorization`` header and the canonical request at DEBUG level.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from yarl import URL

from .._base._config import LIST_CONCURRENCY, READ_TIMEOUT
from .._base._errors import (
    AccessDenied,
    StoreError,
    WrongRegion,
)
from .._base._types import Blob, ObjectInfo
from ._http import ca_bundle_for, normalize_etag, open_clients, send
from ._http_objects import get_object, object_headers, object_info
from ._http_store import HTTPStoreBase, use_lean_client
from ._lean_http import LeanHTTPClient
from ._listing import Page, RangedListing
from ._retry import retrying
from ._s3_auth import UNSIGNED_PAYLOAD, FrozenCredentials, SigV4Signer, uri_encode_path
from ._s3_hosts import aws_host_in, bucket_address
from ._s3_pages import parsed_page, plain_page

if TYPE_CHECKING:
    import aiohttp

__all__ = ["S3Store"]

_CRED_REFRESH_SECONDS = 60.0
T = TypeVar("T")


_GIVEN = object()  # the client's place when the endpoint was given (no client is made)


class S3Store(HTTPStoreBase, RangedListing):
    """An S3 bucket (and key prefix) as an :class:`~asyncloader.ObjectStore`.

    Args:
        bucket: Bucket name.
        prefix: Key prefix of the dataset root ("train/"); keys are reported relative to it.
        endpoint_url: An S3-compatible endpoint (MinIO, moto, ...).  Default: the AWS way
            (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, profile, then AWS itself).
        region: Region; default from the environment or profile, else us-east-1.  A bucket
            in another region is found as botocore finds it: S3's answer names the bucket's
            region, and the store signs for it (and on AWS sends to it) from then on.
        profile: An AWS profile name.
        anonymous: Send unsigned requests (public buckets).
        max_connections: Connection pool size of the hot GET session (aiohttp).
        read_timeout: Longest wait for an answer to start, and then between two reads
            of it: a stalled connection is abandoned (and the request retried), a slow but
            moving one is not [seconds].
        http_client: ``"lean"`` (default: our keep-alive HTTP/1.1 client, about half the
            CPU of aiohttp per GET) or ``"aiohttp"`` (used anyway through a proxy spoken
            to over TLS, an ``https://`` one).
        list_concurrency: Sub-folders listed at once.
        ca_bundle: A PEM file of the CAs to trust for HTTPS instead of the system's (a
            private endpoint's own CA).  Default: ``AWS_CA_BUNDLE``, as the AWS tools,
            else the system's CAs (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` where set).
        requester_pays: Read a requester-pays bucket, the requests billed to this account
            (every request carries ``x-amz-request-payer: requester``, signed; boto3's
            ``RequestPayer="requester"``).  Needs credentials.
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
        region: str | None = None,
        profile: str | None = None,
        anonymous: bool = False,
        max_connections: int = 256,
        read_timeout: float = READ_TIMEOUT,
        http_client: str = "lean",
        list_concurrency: int = LIST_CONCURRENCY,
        ca_bundle: str | None = None,
        requester_pays: bool = False,
        proxy: str | None = None,
    ) -> None:
        use_lean = use_lean_client(http_client)
        if not bucket:
            raise ValueError("an S3 URL needs a bucket: s3://bucket/prefix/")
        if requester_pays and anonymous:
            raise ValueError("requester_pays bills the requester: it needs credentials")
        self._requester_pays = requester_pays
        self._proxy = proxy
        self.bucket = bucket
        self.prefix = prefix
        self._endpoint_url = endpoint_url
        self._region = region
        self._profile = profile
        self._anonymous = anonymous
        self._max_connections = max_connections
        self._read_timeout = read_timeout
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._resolved = False  # endpoint, region and credentials known, clients open
        self._resolving: asyncio.Lock | None = None
        self._session: aiohttp.ClientSession | None = None
        self._use_lean = use_lean
        self._list_concurrency = list_concurrency
        self._ca_bundle = ca_bundle_for(ca_bundle, "AWS_CA_BUNDLE")
        self._lean: LeanHTTPClient | None = None
        self._signer: SigV4Signer | None = None
        self._botocore_creds: Any = None
        self._creds_checked = 0.0
        self._base = ""
        self._host = ""
        self._base_path = ""
        self._signing_region = ""
        self._retired: list[tuple[LeanHTTPClient | None, aiohttp.ClientSession | None]] = []
        self._closed = False

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    async def _ensure(self) -> None:
        self._check_open()
        if self._resolved:
            return
        if self._resolving is None:
            self._resolving = asyncio.Lock()
        async with self._resolving:  # the first requests come together: resolve once
            if not self._resolved:
                await self._resolve()
                self._resolved = True

    async def _resolve(self) -> None:
        from botocore.exceptions import BotoCoreError

        # botocore only resolves the endpoint, region and credentials, the AWS way; every
        # request goes out on our own client (see the module docstring).
        session: Any
        stack = contextlib.AsyncExitStack()
        try:
            if self._endpoint_url is not None:
                # A given endpoint needs no client: botocore would take it as it is, and
                # the region as given or configured.  Making an S3 client loads the
                # service's whole model, and aiobotocore imports aiohttp: together most of
                # a second of CPU in every process that opens the store (each engine
                # process).  botocore's own session finds the credentials (in a thread:
                # a provider may ask an instance's metadata service).
                from botocore.session import get_session as get_sync_session

                session = get_sync_session()
                if self._profile:
                    session.set_config_variable("profile", self._profile)
                self._client = _GIVEN
                region_name = self._region or session.get_config_variable("region")
                endpoint_url = self._endpoint_url
                creds = (
                    None if self._anonymous else await asyncio.to_thread(session.get_credentials)
                )
            else:
                from aiobotocore.config import AioConfig
                from aiobotocore.session import get_session
                from botocore import UNSIGNED

                session = get_session()
                if self._profile:
                    session.set_config_variable("profile", self._profile)
                config = AioConfig(
                    signature_version=UNSIGNED if self._anonymous else None,
                    max_pool_connections=1,
                )
                self._client = await stack.enter_async_context(
                    session.create_client(
                        "s3",
                        endpoint_url=self._endpoint_url,
                        region_name=self._region,
                        config=config,
                    )
                )
                region_name = self._client.meta.region_name
                endpoint_url = self._client.meta.endpoint_url
                creds = None if self._anonymous else await session.get_credentials()
        except BotoCoreError as exc:
            await stack.aclose()
            raise StoreError(
                f"cannot set up access to {self.url}: {type(exc).__name__}: {exc}"
            ) from exc
        self._stack = stack
        region = self._signing_region = region_name or "us-east-1"
        endpoint = URL(endpoint_url)
        self._host, self._base, self._base_path = bucket_address(
            self.bucket,
            endpoint,
            region,
            aws=self._endpoint_url is None,
            fips=bool(session.get_config_variable("use_fips_endpoint")),
            dualstack=bool(session.get_config_variable("use_dualstack_endpoint")),
            style=_addressing_style(session),
        )
        if not self._anonymous:
            self._botocore_creds = creds
            if self._botocore_creds is None:
                raise AccessDenied(f"no AWS credentials found for {self.url}")
            self._signer = SigV4Signer(
                await self._frozen(), region, request_payer=self._requester_pays
            )
            self._creds_checked = time.monotonic()
        self._open_clients()

    def _open_clients(self) -> None:
        self._lean, self._session = open_clients(
            self._base,
            lean=self._use_lean,
            max_connections=self._max_connections,
            read_timeout=self._read_timeout,
            ca_bundle=self._ca_bundle,
            proxy=self._proxy,
        )

    async def _in_bucket_region(self, request: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await request(*args)``, and once more in the bucket's region if S3 answered
        that it is in another one (see :meth:`_move`)."""
        try:
            return await request(*args)
        except WrongRegion as exc:
            self._move(exc)
        return await request(*args)

    def _move(self, exc: WrongRegion) -> None:
        """S3 answered that the bucket is in ``exc.region``: sign for that region from now
        on, and on AWS's own endpoints send there too (botocore's redirector does the
        same).  Requests in flight on the old connections finish there; those connections
        close with the store.  Raises ``exc`` if the answer named no region."""
        region = exc.region
        if not region:
            raise exc
        old, self._signing_region = self._signing_region, region
        if old == region:  # moved already, by a request beside this one
            return
        if self._signer is not None:
            self._signer = self._signer.in_region(region)
        host = aws_host_in(self._host, old, region)
        if host != self._host:
            self._host = host
            self._base = f"https://{host}"
            self._retired.append((self._lean, self._session))
            self._open_clients()

    async def _frozen(self) -> FrozenCredentials:
        c = self._botocore_creds
        get = c.get_frozen_credentials
        if inspect.iscoroutinefunction(get):  # aiobotocore's
            f = await get()
        else:  # botocore's, which may refresh over the network: off the loop
            f = await asyncio.to_thread(get)
        return FrozenCredentials(f.access_key, f.secret_key, f.token)

    async def _ready(self) -> None:
        await self._ensure()

    async def _page(
        self, full: str, delimited: bool, start_after: str, token: str | None
    ) -> tuple[Page, list[str], str | None]:
        """One page of ListObjectsV2 (a :data:`PageFetch`): continuing with ``token``, or
        starting after the key ``start_after`` (a key range listed beside others)."""
        params = {"list-type": "2", "prefix": full}
        if delimited:
            params["delimiter"] = "/"
        if token is not None:
            params["continuation-token"] = token
        elif start_after:
            params["start-after"] = start_after
        what = f"s3://{self.bucket}/{full}"
        return await retrying(
            partial(self._listing_page, params, cut=len(self.prefix), what=what, key=full)
        )

    async def _listing_page(
        self, params: dict[str, str], *, cut: int, what: str, key: str
    ) -> tuple[Page, list[str], str | None]:
        """One listing page: its objects, its sub-folders, and the continuation token (None
        on the last page).  A page cut short is a transient failure (retried)."""
        body = await self._control_get(params, what=what, key=key)
        return plain_page(body, cut) or parsed_page(body, cut, what=what, key=key)

    async def _control_get(self, params: dict[str, str], *, what: str, key: str) -> Blob:
        """A signed GET of the bucket with query ``params`` (a listing page)."""
        await self._ensure()
        return await self._in_bucket_region(self._bucket_get, params, what, key)

    async def _bucket_get(self, params: dict[str, str], what: str, key: str) -> Blob:
        query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items())
        )
        path = self._base_path + "/" if self._base_path else "/"
        headers = await self._auth("GET", path, query)
        return await get_object(
            self._lean, self._session, self._base, f"{path}?{query}", headers, what=what, key=key
        )

    async def _auth(
        self, method: str, path: str, query: str = "", payload_hash: str = UNSIGNED_PAYLOAD
    ) -> dict[str, str]:
        """SigV4 headers for a request (none when anonymous)."""
        signer = self._signer
        if signer is None:
            return {}
        now = time.monotonic()
        if now - self._creds_checked > _CRED_REFRESH_SECONDS:
            # Refreshable credentials (roles, SSO) rotate; botocore refreshes them ahead
            # of expiry when asked, so ask once a minute rather than on every request.
            self._creds_checked = now
            signer.set_credentials(await self._frozen())
        return signer.sign(method, self._host, path, query, payload_hash=payload_hash)

    async def stat(self, key: str) -> ObjectInfo:
        """HEAD the object, signed and sent like a GET: botocore's own request path would
        log the credentials, the ``Authorization`` header and the canonical request at
        DEBUG level."""
        await self._ensure()
        return await self._in_bucket_region(self._stat, key)

    async def _stat(self, key: str) -> ObjectInfo:
        full = self.prefix + key
        path = self._base_path + "/" + uri_encode_path(full)
        what = f"s3://{self.bucket}/{full}"
        headers = await self._auth("HEAD", path)
        answer, _ = await retrying(
            partial(
                send,
                self._lean,
                self._session,
                self._base,
                "HEAD",
                path,
                headers,
                what=what,
                key=key,
            )
        )
        return object_info(key, answer, what=what)

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        if self._session is None and self._lean is None:
            await self._ensure()
        return await self._in_bucket_region(self._get, key, start, end, etag)

    async def _get(self, key: str, start: int, end: int | None, etag: str) -> Blob:
        path = self._base_path + "/" + uri_encode_path(self.prefix + key)
        headers = await self._auth("GET", path)  # SigV4 signs neither Range nor If-Match
        headers.update(object_headers(start, end, etag))
        what = f"s3://{self.bucket}/{self.prefix}{key}"
        return await get_object(
            self._lean,
            self._session,
            self._base,
            path,
            headers,
            what=what,
            key=key,
            start=start,
            end=end,
            etag=etag,
        )

    async def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the object ``key`` (a PutObject, replacing any object there),
        its SHA-256 signed, so that a body changed on the way is refused; retried on
        throttling and transient failures (a PUT of the same bytes is idempotent)."""
        await self._ensure()
        full = self.prefix + key
        path = self._base_path + "/" + uri_encode_path(full)
        what = f"s3://{self.bucket}/{full}"

        async def once() -> ObjectInfo:
            headers = await self._auth("PUT", path, payload_hash=hashlib.sha256(data).hexdigest())
            headers["Content-Type"] = "application/octet-stream"
            answer, _ = await send(
                self._lean,
                self._session,
                self._base,
                "PUT",
                path,
                headers,
                what=what,
                key=key,
                body=data,
            )
            return ObjectInfo(key, len(data), normalize_etag(answer.get("etag", "")))

        return await self._in_bucket_region(retrying, once)

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        lean, self._lean = self._lean, None
        stack, self._stack = self._stack, None
        self._client = None
        retired, self._retired = self._retired, []
        for old_lean, old_session in [(lean, session), *retired]:
            if old_session is not None:
                await old_session.close()
            if old_lean is not None:
                await old_lean.close()
        if stack is not None:
            await stack.aclose()


def _addressing_style(session: Any) -> str:
    """The AWS config's ``s3 = addressing_style = ...`` of the profile in use (``auto``
    where it says nothing), as botocore reads it for boto3."""
    s3 = session.get_scoped_config().get("s3")
    return str(s3.get("addressing_style", "auto")) if isinstance(s3, dict) else "auto"
