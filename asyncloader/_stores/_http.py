"""The HTTP every backend shares: its clients (the lean one, or an aiohttp session, which a
proxy gets), sending one request on either (:func:`send`), and the mapping of answers to
our error tree.  Where a request goes on its way (its proxy, a redirect) is
:mod:`._routes`'.

Backends build the target and headers (signature, range, precondition); this module sends
the request, reads the body, and maps every HTTP status and transport exception to
:mod:`asyncloader._base._errors` in one place.  Reading an object (the range and encoding
asked for, the answer checked) is :mod:`._http_objects`'.
"""

from __future__ import annotations

import contextlib
import email.utils
import gc
import os
import re
import ssl
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

from yarl import URL

from .._base._config import READ_TIMEOUT
from .._base._errors import (
    AccessDenied,
    IntegrityError,
    ObjectNotFound,
    StoreError,
    Throttled,
    TransientStoreError,
    WrongRegion,
)
from .._base._manifest import normalize_etag
from .._base._types import Blob
from ._gate import PROXY_CONNECTIONS
from ._lean_http import LeanHTTPClient, LeanResponse, ProtocolError, tls_context
from ._routes import (
    MAX_REDIRECTS,
    PROXY_LOGIN,
    REDIRECTS,
    Redirected,
    proxy_for,
    proxy_refusal,
    redirected,
)
from ._tunnel import TunnelRefused, lean_route

if TYPE_CHECKING:
    import aiohttp  # imported where a session is made: it takes 0.2 s to import

__all__ = [
    "MAX_REDIRECTS",
    "REDIRECTS",
    "Redirected",
    "REQUESTS_CA_NAMES",
    "ca_bundle_for",
    "open_clients",
    "error_for_status",
    "retry_after",
    "send",
    "make_session",
    "proxy_for",
    "proxy_refusal",
    "redirected",
    "normalize_etag",
    "parse_xml",
    "request",
]

T = TypeVar("T")
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
_REGION = re.compile(rb"<Region>([a-z0-9-]{1,64})</Region>")


def make_session(
    max_connections: int,
    *,
    read_timeout: float = READ_TIMEOUT,
    ssl_context: ssl.SSLContext | None = None,
    proxy: str | None = None,
) -> aiohttp.ClientSession:
    """A session tuned for many small GETs to few hosts: keep-alive, ``Accept-Encoding:
    identity`` (what S3 clients send: an object's bytes as stored, whatever a server would
    compress) and no decompression of its own; through ``proxy`` where given (its
    credentials, if any, in its URL; at most ``PROXY_CONNECTIONS`` connections then, as
    the lean client keeps through a proxy, without its cuts)."""
    import aiohttp

    connector = aiohttp.TCPConnector(
        limit=max_connections if proxy is None else min(max_connections, PROXY_CONNECTIONS),
        limit_per_host=0,
        ttl_dns_cache=300,
        keepalive_timeout=60,
        ssl=ssl_context if ssl_context is not None else True,
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        raise_for_status=False,
        headers={"Accept-Encoding": "identity"},
        proxy=proxy,
    )


def open_clients(
    endpoint: str,
    *,
    lean: bool,
    aiohttp_too: bool = False,
    max_connections: int,
    read_timeout: float,
    ca_bundle: str | None,
    proxy: str | None = None,
) -> tuple[LeanHTTPClient | None, aiohttp.ClientSession | None]:
    """A store's HTTP clients for ``endpoint`` (``scheme://host[:port]``): the lean client
    when ``lean`` (through the proxy on the way, :func:`proxy_for` of ``proxy``, a store
    option, or the environment, where it speaks to that proxy: :meth:`._tunnel.Proxy.of`),
    else (or also, with ``aiohttp_too``) an aiohttp session, through that proxy; over
    HTTPS both trust ``ca_bundle`` (else the system's CAs), loaded once."""
    base = URL(endpoint)
    https = base.scheme == "https"
    via = proxy_for(endpoint, proxy)
    speaks, lean_via = lean_route(via)
    lean = lean and speaks  # an https:// proxy: aiohttp's
    tls = tls_context(ca_bundle) if https else None
    client = None
    if lean:
        assert base.host is not None
        assert base.port is not None
        client = LeanHTTPClient(
            "https" if https else "http",
            base.host,
            base.port,
            read_timeout=read_timeout,
            ssl_context=tls,
            proxy=lean_via,
        )
    session = None
    if aiohttp_too or not lean:
        session = make_session(
            max_connections, read_timeout=read_timeout, ssl_context=tls, proxy=via
        )
    return client, session


def _untrusted(what: str, key: str | None, exc: Exception) -> StoreError:
    """A server certificate that does not verify: not transient, and not retried."""
    return StoreError(
        f"the TLS certificate of the server of {what} is not trusted ({exc}); for a private "
        "CA, pass its PEM file as ca_bundle= (or set AWS_CA_BUNDLE for S3, "
        "REQUESTS_CA_BUNDLE for the other stores)",
        key=key,
    )


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a throttled answer asks for [seconds]: ``retry-after-ms`` /
    ``x-ms-retry-after-ms`` (Azure) or ``Retry-After`` in seconds or as an HTTP date; None
    if it names none (``headers``: lower-case names, or a case-insensitive mapping)."""
    for name, scale in (("retry-after-ms", 0.001), ("x-ms-retry-after-ms", 0.001)):
        value = headers.get(name)
        if value:
            with contextlib.suppress(ValueError):
                return max(0.0, float(value) * scale)
    value = headers.get("retry-after")
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


def error_for_status(
    status: int,
    body: bytes,
    *,
    what: str,
    key: str | None,
    code: str = "",
    region: str = "",
    wait: float | None = None,
) -> StoreError:
    """Map an HTTP error answer to our error tree; ``what`` names the object for humans.

    ``code`` is the service's error code when it came in a header (Azure's
    ``x-ms-error-code``, the only place a HEAD answer has it); else it is read from the
    XML body (``<Code>...</Code>``, S3 and Azure alike).  ``region``: S3's
    ``x-amz-bucket-region`` header, which names the bucket's region when a request went to
    (or was signed for) another one.  ``wait``: what a throttled answer asked for
    (:func:`retry_after`).
    """
    if not code:
        m = _CODE.search(body[:2048])
        code = m.group(1).decode(errors="replace") if m else ""
    detail = f"{status} {code}".strip()
    if not region:
        m = _REGION.search(body[:2048])
        region = m.group(1).decode() if m else ""
    # Signed for another region: the malformed header's answer names the right one.  A
    # HEAD's answer has no body: its status and the region header are all it says.
    if code == "PermanentRedirect" or (
        region and (code == "AuthorizationHeaderMalformed" or (status in (301, 400) and not code))
    ):
        return WrongRegion(
            f"{what} is in another region ({detail}{f', region {region}' if region else ''})"
            ": pass the bucket's region (the store option region=...: a loader's "
            "StoreConfig(options={'region': ...})) or set AWS_REGION",
            key=key,
            status=status,
            region=region,
        )
    if status == 404:
        return ObjectNotFound(f"not found: {what} ({detail})", key=key, status=status)
    if status == 407:  # only a proxy asks it, of a plain-HTTP request it forwards
        return AccessDenied(
            f"the proxy on the way to {what} asks for credentials ({detail}): {PROXY_LOGIN}",
            key=key,
            status=status,
        )
    if status in (401, 403):
        return AccessDenied(
            f"access denied to {what} ({detail}): check the credentials and permissions",
            key=key,
            status=status,
        )
    if status == 412:
        return IntegrityError(
            f"{what} changed since it was listed (ETag no longer matches)", key=key, status=status
        )
    if status == 416:
        return IntegrityError(
            f"{what} is shorter than listed (range not satisfiable)", key=key, status=status
        )
    if status in (429, 503) or code in ("SlowDown", "ServerBusy", "TooManyRequests"):
        return Throttled(
            f"throttled on {what} ({detail})", key=key, status=status, retry_after=wait
        )
    if status >= 500 or status == 408:
        return TransientStoreError(f"server error on {what} ({detail})", key=key, status=status)
    return StoreError(f"unexpected answer for {what} ({detail})", key=key, status=status)


async def request(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: Mapping[str, str],
    *,
    what: str,
    key: str | None,
    body: bytes | None = None,
    landed: list[URL] | None = None,
) -> tuple[Mapping[str, str], bytes]:
    """Send one request (with ``body``, a PUT's or POST's); return the answer's headers and
    body, or raise a mapped error.  ``landed``: where given, the URL the answer came from
    (after the redirects aiohttp followed) is appended to it.

    Raises:
        ObjectNotFound, AccessDenied, IntegrityError, Throttled, TransientStoreError,
        StoreError: as mapped by :func:`error_for_status`; transport failures (reset,
        time-out, truncated body) become TransientStoreError.
    """
    import aiohttp  # imported already: a session exists

    try:
        async with session.request(method, url, headers=headers, data=body) as resp:
            if landed is not None:
                landed.append(resp.url)
            answer = await resp.read()
            if resp.status >= 300:
                raise error_for_status(
                    resp.status,
                    answer,
                    what=what,
                    key=key,
                    code=resp.headers.get("x-ms-error-code", ""),
                    region=resp.headers.get("x-amz-bucket-region", ""),
                    wait=retry_after(resp.headers),
                )
            return resp.headers, answer
    except StoreError:
        raise
    except aiohttp.ClientHttpProxyError as exc:
        # Not chained: the error's text holds the proxy's URL, credentials and all.
        raise proxy_refusal(exc.status, exc.message, what=what, key=key) from None
    except aiohttp.TooManyRedirects:
        # Not retried: another try goes round the same loop.  Not chained: its text holds
        # the URL, a token in its query and all.
        raise StoreError(
            f"{what}: still redirected after {MAX_REDIRECTS} requests", key=key
        ) from None
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        raise TransientStoreError(f"connection broke while reading {what}", key=key) from exc
    except TimeoutError as exc:  # before OSError, of which it is a subclass
        raise TransientStoreError(f"request for {what} timed out", key=key) from exc
    except (ssl.SSLCertVerificationError, aiohttp.ClientConnectorCertificateError) as exc:
        raise _untrusted(what, key, exc) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise TransientStoreError(
            f"request for {what} failed: {type(exc).__name__}", key=key
        ) from exc


def parse_xml(body: Blob, *, what: str, key: str | None) -> ET.Element:
    """A listing page's XML.

    Raises:
        TransientStoreError: the page is not well-formed XML: cut short on the way, as a
            rewritten Content-Length does (the caller retries it like a failed request).
    """
    try:
        with gc_paused():
            return ET.fromstring(body)
    except ET.ParseError as exc:
        raise TransientStoreError(
            f"unreadable listing page of {what} ({len(body)} bytes; cut short?)", key=key
        ) from exc


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a listing page becomes a tree, then objects, and
    the tree is dropped: its ~6 elements per key set off collection after collection, each
    going through every object alive, the keys listed so far among them.  Paused, the tree
    (it holds no cycles) goes by reference counting and the next collection sees only the
    page's objects.  Listing 60 000 keys: 10.7-12.1 µs of client CPU per key, 5.8-6.2 µs
    with the parse paused, 5.4 µs with the whole page paused."""
    if not gc.isenabled():  # paused already (another page, or the application's choice)
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def ca_bundle_for(ca_bundle: str | None, *names: str) -> str | None:
    """The PEM file of the CAs a store trusts: ``ca_bundle`` where given, else the first of
    the environment variables ``names`` that is set (as the service's own tools read
    them), else None: OpenSSL's defaults (the system's CAs; ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` where set)."""
    if ca_bundle:
        return ca_bundle
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


REQUESTS_CA_NAMES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
"""What requests reads (so Azure's and Google's Python SDKs, whose transport it is)."""


async def _lean_request(
    client: LeanHTTPClient,
    method: str,
    target: str,
    headers: dict[str, str],
    *,
    what: str,
    key: str | None,
    body: bytes | None = None,
) -> LeanResponse:
    """One request on the lean client; a success, or an error of our tree."""
    try:
        resp = await client.get(target, headers, method=method, body=body)
    except TimeoutError as exc:
        raise TransientStoreError(f"request for {what} timed out", key=key) from exc
    except ssl.SSLCertVerificationError as exc:
        raise _untrusted(what, key, exc) from exc
    except ProtocolError as exc:
        raise TransientStoreError(f"connection broke while reading {what}", key=key) from exc
    except TunnelRefused as exc:
        raise proxy_refusal(exc.status, exc.reason, what=what, key=key) from None
    except OSError as exc:  # connecting: refused, unreachable, a name not resolved
        raise TransientStoreError(f"request for {what} failed: {exc!r}", key=key) from exc
    if resp.status >= 300:
        error = error_for_status(
            resp.status,
            bytes(resp.body),
            what=what,
            key=key,
            code=resp.headers.get("x-ms-error-code", ""),
            region=resp.headers.get("x-amz-bucket-region", ""),
            wait=retry_after(resp.headers),
        )
        location = resp.headers.get("location")
        # A redirect that says nothing else (S3's to another region is a WrongRegion).
        if type(error) is StoreError and resp.status in REDIRECTS and location:
            raise Redirected(
                # The place without its query: a CDN's signed URL is a credential.
                f"{what} is redirected ({resp.status}) to {location.partition('?')[0]}",
                key=key,
                status=resp.status,
                location=location,
            )
        raise error
    return resp


async def send(
    lean: LeanHTTPClient | None,
    session: aiohttp.ClientSession | None,
    base: str,
    method: str,
    target: str,
    headers: dict[str, str],
    *,
    what: str,
    key: str | None,
    body: bytes | None = None,
    landed: list[URL] | None = None,
) -> tuple[Mapping[str, str], Blob]:
    """Send ``method`` for ``target`` (path and query, encoded), with ``body`` (a PUT's or
    POST's), on the lean client when there is one, else on aiohttp below ``base``; the
    answer's headers (lower-case names on the lean client) and body.  ``landed``: as
    :func:`request`'s, where aiohttp followed redirects (the lean client raises
    :class:`Redirected` for its caller to follow).

    Raises:
        The errors of :func:`request`.
    """
    if lean is not None:
        resp = await _lean_request(lean, method, target, headers, what=what, key=key, body=body)
        return resp.headers, resp.body
    assert session is not None
    url = URL(base + target, encoded=True)
    return await request(
        session, method, url, headers, what=what, key=key, body=body, landed=landed
    )
