"""Object stores by URL: ``s3://bucket/prefix/``, ``file:///path/`` or a plain path."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .._types import ObjectStore
from ._local import LocalStore
from ._s3 import S3Store, parse_s3_url

__all__ = ["LocalStore", "S3Store", "open_store"]


def open_store(url: str, **options: Any) -> ObjectStore:
    """Return the store for ``url``; ``options`` go to the backend's constructor.

    Raises:
        ValueError: an unknown scheme.
    """
    scheme = urlsplit(url).scheme
    if scheme == "s3":
        bucket, prefix = parse_s3_url(url)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return S3Store(bucket, prefix, **options)
    if scheme == "file":
        return LocalStore(urlsplit(url).path, **options)
    if scheme == "":
        return LocalStore(url, **options)
    raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}: use s3://, file:// or a path")
