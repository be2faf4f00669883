"""Object stores by URL: S3, Azure Blob, plain HTTP(S) with a manifest, local folders.

* ``s3://bucket/prefix/``
* ``gs://bucket/prefix/`` (Google Cloud Storage)
* ``az://container/prefix/`` (account from the environment), ``az://account/container/prefix/``
  or ``https://ACCOUNT.blob.core.windows.net/container/prefix/``
* ``https://host/path/`` (other hosts): objects named by a manifest, the folder's metadata
  file, or the server's folder pages
* ``file:///path/`` or a plain path

Its modules: one per backend (``_s3`` with ``_s3_pages`` and ``_s3_hosts``, ``_gcs``,
``_azure``, ``_web`` with its folder pages walked in ``_web_walk`` and read in
``_web_index``, ``_local``, and ``_mixed``: several sources' stores as one), their
credentials (``_s3_auth``, ``_gcs_auth``, ``_azure_auth``, ``_bearer``), the HTTP clients
(``_http``, ``_lean_http`` with its connections in ``_lean_conn``, ``_tls``, ``_tunnel``:
the lean client's way through a forward proxy, and ``_gate``: how many requests at once to
a server that closes every connection, and through a proxy),
where a request goes on its way (``_routes``: proxies,
a proxy's refusals, redirects), an object read over HTTP and its checks
(``_http_objects``) and what the HTTP stores share (``_http_store``), sorted listing in
chunks (``_listing``) and the one retry loop (``_retry``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from .._base._manifest import is_columnar, is_manifest
from .._base._sources import Source
from .._base._types import ObjectStore
from ._azure import AzureStore, azure_store_from_url
from ._gcs import GCSStore, gcs_store_from_url
from ._local import LocalStore
from ._mixed import MixedStore
from ._routes import with_login
from ._s3 import S3Store
from ._s3_hosts import parse_s3_url
from ._web import HttpStore

__all__ = [
    "AzureStore",
    "GCSStore",
    "HttpStore",
    "LocalStore",
    "S3Store",
    "lists_from_manifest",
    "open_sources",
    "open_store",
    "service_of",
    "store_options",
]


def _is_azure(parts: SplitResult) -> bool:
    return parts.scheme in ("az", "abfs") or (
        parts.scheme == "https" and (parts.hostname or "").endswith(".blob.core.windows.net")
    )


def lists_from_manifest(url: str) -> bool:
    """Whether ``url`` names a plain HTTP(S) location, whose objects a manifest lists."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and not _is_azure(parts)


def store_options(url: str, labels: object, options: dict[str, Any] | None) -> dict[str, Any]:
    """The store options a loader of ``url`` with ``labels`` opens its store with: a plain
    web server has no listing, its manifest lists the objects; credentials in a web URL
    (``https://user:password@host/``) are its ``Authorization`` header, so that a process
    that opens the store by its URL (an engine's: the store's URL never holds them) sends
    them too."""
    out = dict(options or {})
    if lists_from_manifest(url) and is_manifest(labels) and not is_columnar(labels):
        out.setdefault("manifest", labels)
    parts = urlsplit(url)
    if parts.username is not None and service_of(url) == "http":
        out["headers"] = with_login(dict(out.get("headers") or {}), parts.username, parts.password)
    return out


def service_of(url: str) -> str:
    """Which backend serves ``url``: ``"s3"``, ``"gs"``, ``"az"``, ``"http"`` (a plain web
    server) or ``"file"``.

    Raises:
        ValueError: an unknown scheme.
    """
    parts = urlsplit(url)
    scheme = parts.scheme
    if scheme == "s3":
        return "s3"
    if scheme in ("gs", "gcs"):
        return "gs"
    if _is_azure(parts):
        return "az"
    if scheme in ("http", "https"):
        return "http"
    if scheme == "file" or scheme == "" or len(scheme) == 1:  # (a Windows drive letter)
        return "file"
    raise ValueError(
        f"unsupported URL scheme {scheme!r} in {url!r}: "
        "use s3://, gs://, az://, https://, file:// or a path"
    )


_BACKENDS: dict[str, type] = {
    "s3": S3Store,
    "gs": GCSStore,
    "az": AzureStore,
    "http": HttpStore,
    "file": LocalStore,
}


def _check_options(service: str, options: dict[str, Any]) -> None:
    """Refuse an option the backend does not take, naming those it does (a misspelled
    option is a clear error, not a TypeError from deep inside)."""
    backend = _BACKENDS[service]
    params = inspect.signature(backend).parameters.values()
    known = sorted(p.name for p in params if p.kind is p.KEYWORD_ONLY)  # the URL sets the rest
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"takes {', '.join(known)}" if known else "takes no options"
        raise ValueError(
            f"unknown store option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} for {service}:// ({backend.__name__} {takes})"
        )


def open_store(url: str, **options: Any) -> ObjectStore:
    """Return the store for ``url``; ``options`` go to the backend's constructor.

    Raises:
        ValueError: an unknown scheme, a URL without its bucket/container, or an option
            the backend does not take.
    """
    service = service_of(url)
    _check_options(service, options)
    if service == "s3":
        bucket, prefix = parse_s3_url(url)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return S3Store(bucket, prefix, **options)
    if service == "gs":
        return gcs_store_from_url(url, **options)
    if service == "az":
        return azure_store_from_url(url, **options)
    if service == "http":
        return HttpStore(url, **options)
    parts = urlsplit(url)
    return LocalStore(unquote(parts.path) if parts.scheme == "file" else url, **options)


def open_sources(sources: Sequence[Source]) -> MixedStore:
    """The stores of several ``sources`` (resolved: :func:`~asyncloader._base._sources.
    as_sources`) as one.  Opening connects nothing yet (the first request does).

    Raises:
        ValueError: as :func:`open_store`.
    """
    return MixedStore(
        [open_store(s.url, **store_options(s.url, s.labels, s.store_options)) for s in sources]
    )
