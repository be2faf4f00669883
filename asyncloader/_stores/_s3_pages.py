"""ListObjectsV2 pages read into objects, sub-folders and a continuation token: by scanning
where a page is plain (most are), else through the XML parser."""

from __future__ import annotations

import re

from .._base._types import Blob, ObjectInfo
from ._http import gc_paused, normalize_etag, parse_xml
from ._listing import Page

__all__ = ["parsed_page", "plain_page"]

# A ListObjectsV2 page as S3 (and what speaks its API) writes it, read without building a
# tree: ElementTree costs ~3 µs a key, these scans ~0.7.
_KEYS = re.compile(rb"<Key>([^<&]*)</Key>")
_ETAGS = re.compile(rb"<ETag>([^<]*)</ETag>")
_SIZES = re.compile(rb"<Size>([0-9]+)</Size>")
_FOLDERS = re.compile(rb"<CommonPrefixes>\s*<Prefix>([^<&]*)</Prefix>\s*</CommonPrefixes>")
_TRUNCATED = re.compile(rb"<IsTruncated>(true|false)</IsTruncated>")
_TOKEN = re.compile(rb"<NextContinuationToken>([^<&]*)</NextContinuationToken>")
_END = b"</ListBucketResult>"


def parsed_page(body: Blob, cut: int, *, what: str, key: str) -> tuple[Page, list[str], str | None]:
    """A listing page's objects, sub-folders and continuation token, through the XML parser.

    Raises:
        TransientStoreError: not well-formed (cut short on the way).
    """
    with gc_paused():  # (see there) from the tree to the objects, and the tree dropped
        root = parse_xml(body, what=what, key=key)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        prefixes = [p.findtext(f"{ns}Prefix") or "" for p in root.iterfind(f"{ns}CommonPrefixes")]
        page: Page = []
        for item in root.iterfind(f"{ns}Contents"):
            name = item.findtext(f"{ns}Key") or ""
            if name.endswith("/"):
                continue  # folder placeholder objects
            size = int(item.findtext(f"{ns}Size") or 0)
            etag = normalize_etag(item.findtext(f"{ns}ETag") or "")
            page.append(ObjectInfo(name[cut:], size, etag))
        token = root.findtext(f"{ns}NextContinuationToken")
        if root.findtext(f"{ns}IsTruncated") != "true" or not token:
            token = None
        del root
    return page, prefixes, token


def plain_page(body: Blob, cut: int) -> tuple[Page, list[str], str | None] | None:
    """A listing page's objects, sub-folders and continuation token, read by scanning;
    None unless the page is complete and plain — one key, ETag and size per ``<Contents>``,
    one prefix per ``<CommonPrefixes>``, no escaped character but the ETags' quotes — so
    that anything else (a page cut short, an error, escapes) goes through the XML parser."""
    data = bytes(body)
    if not data.rstrip().endswith(_END) or b"<ListBucketResult" not in data[:200]:
        return None
    keys, etags, sizes = _KEYS.findall(data), _ETAGS.findall(data), _SIZES.findall(data)
    n = data.count(b"<Contents>")
    folders = _FOLDERS.findall(data)
    truncated = _TRUNCATED.findall(data)
    if not len(keys) == len(etags) == len(sizes) == n or len(truncated) != 1:
        return None
    if len(folders) != data.count(b"<CommonPrefixes>"):
        return None
    if len(_TOKEN.findall(data)) != data.count(b"<NextContinuationToken>"):
        return None  # an escaped token: the parser reads it
    quoted = [e.replace(b"&quot;", b'"') for e in etags]
    if any(b"&" in e for e in quoted):
        return None
    page: Page = []
    with gc_paused():
        for k, e, size in zip(keys, quoted, sizes, strict=True):
            name = k.decode()
            if not name.endswith("/"):  # folder placeholder objects
                page.append(ObjectInfo(name[cut:], int(size), normalize_etag(e.decode())))
    token = _TOKEN.search(data) if truncated[0] == b"true" else None
    return page, [f.decode() for f in folders], (token.group(1).decode() or None) if token else None
