"""Reading an object over HTTP, on whichever client: the headers a GET asks with (a range,
``If-Match``, ``Accept-Encoding: identity``), and the answer checked before it is the
object — its ``Content-Range`` against the range asked for (a server that ignores ``Range``
answers with the whole object: :func:`whole_answer`), a ``Content-Encoding`` that arrives
anyway undone, its length and version; an object's size and ETag from a HEAD.

An object's version is its ETag (S3's, Azure's, a web server's) or its generation (GCS's).
A web server that sends no ETag (``python -m http.server``) and a folder page that gives
sizes without ETags (nginx's ``autoindex``, Caddy's ``browse``, serve-index's) tell when
the file was last modified instead: that is its version then, as a text no ETag can be (it
holds a space): :func:`answer_version`, :func:`page_version`, checked as
:func:`version_check` says."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._base._errors import IntegrityError, LengthMismatch, StoreError, TransientStoreError
from .._base._types import Blob, ObjectInfo
from ._http import normalize_etag, send

if TYPE_CHECKING:
    import aiohttp

    from ._lean_http import LeanHTTPClient

__all__ = [
    "LAST_MODIFIED",
    "PAGE_MODIFIED",
    "answer_version",
    "check_body",
    "decoded",
    "get_object",
    "object_headers",
    "object_info",
    "page_version",
    "parse_content_range",
    "range_header",
    "version_check",
    "whole_answer",
]

LAST_MODIFIED = "last-modified "
"""The start of the version of an object whose server sends no ETag: this and its
``Last-Modified`` (``"last-modified Sun, 06 Dec 2026 18:29:33 GMT"``).  Each answer that
carries a ``Last-Modified`` is compared with it, as an ETag is."""
PAGE_MODIFIED = "page-modified "
"""The start of the version of a file that a folder page sizes (no HEAD, so no ETag): this
and the time the page says it was last modified, as the page writes it.  It tells the
cache that a file of the same size was replaced; no answer carries it to compare."""


def answer_version(headers: Mapping[str, str]) -> str:
    """An object's version from the headers of an answer (lower-case names): its ETag
    (normalised), else its ``Last-Modified`` (:data:`LAST_MODIFIED`), else ``""``."""
    etag = headers.get("etag", "")
    if etag:
        return normalize_etag(etag)
    modified = headers.get("last-modified", "").strip()
    return LAST_MODIFIED + modified if modified else ""


def page_version(time: str) -> str:
    """The version of a file a folder page sizes, from the time the page gives it."""
    return PAGE_MODIFIED + time


def version_check(version: str) -> tuple[str, str]:
    """What a GET's answer must carry to be the listed ``version``, and in which header
    (lower-case): an ETag in ``etag``; a :data:`LAST_MODIFIED` version's time in
    ``last-modified``; nothing for a :data:`PAGE_MODIFIED` one (``""``: unchecked)."""
    if version.startswith(LAST_MODIFIED):
        return version.removeprefix(LAST_MODIFIED), "last-modified"
    if version.startswith(PAGE_MODIFIED):
        return "", "etag"
    return version, "etag"


def range_header(start: int, end: int | None) -> str | None:
    """``Range`` value for bytes ``[start, end)``; ``None`` when the whole object is wanted."""
    if start == 0 and end is None:
        return None
    return f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"


def object_headers(
    start: int, end: int | None, etag: str, *, range_name: str = "Range"
) -> dict[str, str]:
    """The headers of a GET of bytes ``[start, end)`` of the version ``etag``: a range (S3
    and HTTP name it ``Range``, Azure's signed one ``x-ms-range``), ``If-Match``, and
    ``Accept-Encoding: identity`` (nginx with ``gzip on`` would compress it otherwise)."""
    headers = {"Accept-Encoding": "identity"}  # the object's bytes as stored, as S3 clients ask
    rng = range_header(start, end)
    if rng:
        headers[range_name] = rng
    if etag:
        headers["If-Match"] = f'"{etag}"'
    return headers


async def get_object(
    lean: LeanHTTPClient | None,
    session: aiohttp.ClientSession | None,
    base: str,
    target: str,
    headers: dict[str, str],
    *,
    what: str,
    key: str,
    start: int = 0,
    end: int | None = None,
    etag: str = "",
    version_header: str = "etag",
) -> Blob:
    """GET ``target`` (path and query, encoded) below ``base`` — on the lean client when
    there is one, else on aiohttp — and return the body, verified to be ``end - start``
    bytes long (when ``end`` is given) and, when the answer names one in its
    ``version_header`` (lower-case), to be the version ``etag`` (for servers that ignore
    the precondition).  Every store's GET goes through here.

    A range (``start``, ``end``) is checked against the answer's ``Content-Range``.  A
    server that ignores ``Range`` (nginx's ``max_ranges 0``, many CDNs and proxies, GCS for
    gzip-transcoded objects) answers 200 with the whole object and no ``Content-Range``:
    that body is returned whole, for the caller to use (see :func:`whole_answer`).

    Raises:
        The errors of :func:`request`, IntegrityError for a body of the wrong length or
        version, and TransientStoreError (retried) for a ``Content-Range`` that is not the
        range asked for.
    """
    expected = None if end is None else end - start
    answer, body = await send(lean, session, base, "GET", target, headers, what=what, key=key)
    body = decoded(body, answer, what=what, key=key)
    answer_etag = answer.get(version_header, "")
    if range_header(start, end) is not None:
        got = answer.get("content-range")
        if got is None:
            expected = None  # the whole object: the caller knows its size
        elif (span := parse_content_range(got))[0] != start or (
            end is not None and span[1] != end - 1
        ):
            raise TransientStoreError(
                f"{what}: asked for bytes {start}-{'' if end is None else end - 1}, the answer "
                f"holds {got!r}",
                key=key,
            )
    named = "ETag" if version_header == "etag" else version_header.title()
    check_body(body, answer_etag, what=what, key=key, expected_len=expected, etag=etag, named=named)
    return body


def decoded(body: Blob, headers: Mapping[str, str], *, what: str, key: str | None) -> Blob:
    """``body`` with its ``Content-Encoding`` undone: gzip or deflate (a server or proxy
    that compresses though asked for identity); none, or ``identity``, as it is.  What a
    length check then compares is the object's own bytes, never the compressed ones.

    Raises:
        TransientStoreError: a compressed body that does not decompress (cut short on the
            way: retried).
        StoreError: an encoding asyncloader does not undo (br, zstd), named.
    """
    coding = headers.get("content-encoding", "").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise StoreError(
            f"{what}: the server sent it with Content-Encoding: {coding}, which asyncloader "
            "does not undo (it asks for identity: a proxy or server that ignores that "
            "should be told not to compress)",
            key=key,
        )
    try:
        if coding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send
            wbits = zlib.MAX_WBITS if bytes(body[:1]) == b"\x78" else -zlib.MAX_WBITS
            return zlib.decompress(body, wbits)
        return gzip.decompress(body)
    except (zlib.error, OSError, EOFError) as exc:
        raise TransientStoreError(
            f"{what}: a {coding} answer that does not decompress ({exc})", key=key
        ) from exc


def parse_content_range(value: str) -> tuple[int, int, int | None]:
    """``bytes FIRST-LAST/TOTAL`` as (first, last, total); a total of ``*`` is None.

    Raises:
        TransientStoreError: not a byte range.
    """
    unit, _, spec = value.strip().partition(" ")
    span, _, total = spec.partition("/")
    first, _, last = span.partition("-")
    try:
        if unit.lower() != "bytes" or not first.isdigit() or not last.isdigit():
            raise ValueError(value)
        return int(first), int(last), None if total.strip() == "*" else int(total)
    except ValueError:
        raise TransientStoreError(
            f"an answer's Content-Range is not a byte range: {value!r}"
        ) from None


def whole_answer(data: Blob, start: int, end: int | None, size: int) -> bool:
    """Whether ``data``, the answer to a GET of bytes ``[start, end)`` of an object of
    ``size`` bytes, is the whole object instead (a server that ignores ``Range``)."""
    asked = (size if end is None else end) - start
    return len(data) != asked and len(data) == size and range_header(start, end) is not None


def check_body(
    data: Blob,
    answer_etag: str,
    *,
    what: str,
    key: str,
    expected_len: int | None,
    etag: str,
    named: str = "ETag",
) -> None:
    """Refuse a complete answer of the wrong size or version: not the object listed.
    ``named``: the header the version is in, as an error names it.

    (A body shorter than its own Content-Length is a transport failure, caught earlier.)
    """
    if expected_len is not None and len(data) != expected_len:
        raise LengthMismatch(
            f"{what}: received {len(data)} bytes, expected {expected_len}", key=key
        )
    if etag and answer_etag and normalize_etag(answer_etag) != etag:
        raise IntegrityError(f"{what} changed since it was listed ({named} differs)", key=key)


def object_info(key: str, headers: Mapping[str, str], *, what: str) -> ObjectInfo:
    """An object's size and ETag from the headers of a HEAD answer (either client's).

    Raises:
        StoreError: the answer has no Content-Length.
    """
    size = headers.get("content-length")
    if size is None:
        raise StoreError(f"{what}: the answer gave no Content-Length", key=key)
    return ObjectInfo(key, int(size), normalize_etag(headers.get("etag", "")))
