"""A web folder listed by its server's folder pages (nginx's ``autoindex``, Caddy's
``browse``, ``http.server``, lighttpd's, Express's ``serve-index``, Apache's): the walk
down its folders, a few pages at once, each page read through the store's GET and parsed by
:mod:`._web_index`.

A page is asked for in JSON first (:data:`FOLDER_PAGE_ACCEPT`: Caddy then gives exact
sizes); a server whose JSON is no list read here (``serve-index``'s names alone) is asked
again in HTML, and in HTML from then on.  A link without its slash that may be a folder
(``Index.maybe``) is asked for at the link and a ``/``.  A folder whose page the server
refuses is named in a warning; folders deeper than :data:`~._web_index.MAX_DEPTH` (a
symlink loop) are an error.  A file the pages size is listed with the time they say it was
last modified as its version (:func:`~._http_objects.page_version`).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Protocol

from .._base._errors import AccessDenied, ObjectNotFound, StoreError
from .._base._types import Blob
from ._http_objects import page_version
from ._web_index import MAX_DEPTH, Index, read_index

__all__ = ["FOLDER_PAGE_ACCEPT", "FolderWalk", "HTML_PAGE_ACCEPT", "PageReader"]

log = logging.getLogger("asyncloader")

FOLDER_PAGE_ACCEPT = "application/json, text/html;q=0.9, */*;q=0.8"
"""The ``Accept`` of a folder page's request: a server that can answer with a list in JSON
(Caddy's ``file_server browse``: each file's exact size) is asked for it; the rest send the
page they have (nginx's format is its configuration's, ``http.server``'s and Apache's are
HTML)."""
HTML_PAGE_ACCEPT = "text/html, */*;q=0.8"
"""The ``Accept`` of a folder page asked again where its JSON was no list read here."""


class PageReader(Protocol):
    """The store's GET of a page: ``key`` under the base URL, ``what`` naming it in errors,
    with the ``Accept`` given; the answer's headers, its body (``Content-Encoding`` undone)
    and the URL it came from (after redirects).  Raises ObjectNotFound (404) or
    AccessDenied (401, 403)."""

    async def __call__(
        self, name: str, what: str, accept: str | None = None
    ) -> tuple[Mapping[str, str], Blob, str]: ...


class FolderWalk:
    """One listing of the folder at ``base`` by its pages, read by ``read`` (at most
    ``at_once`` pages at a time)."""

    def __init__(self, read: PageReader, base: str, at_once: int) -> None:
        self._read = read
        self._base = base
        self._at_once = asyncio.Semaphore(at_once)
        self._json = True  # pages asked in JSON first, until a server's JSON is no list
        self._refused: list[str] = []  # folders linked whose page the server would not give

    async def listing(self) -> list[dict[str, str]] | None:
        """Every file the base URL's page links below itself, and every file of the
        folders it links, walked down, sorted by key, each with its size where the page
        gives it exactly (nginx's pages, Caddy's JSON, serve-index's HTML), and then its
        version where the page gives its modification time.  None where
        the base URL's page is not a folder page (404, 403, or a page without links below
        it).

        Raises:
            StoreError: folders deeper than :data:`~._web_index.MAX_DEPTH` (a loop).
        """
        first, _ = await self._page("")
        if first is None:
            return None
        files: dict[str, int | None] = {}
        times: dict[str, str] = {}
        seen: set[str] = set()
        level = [first]
        while level:
            folders: list[str] = []
            maybe: list[str] = []
            for index in level:
                for key, size in index.files:
                    files.setdefault(key, size)
                for key, time in index.times:
                    times.setdefault(key, time)
                folders += [f for f in index.folders if f not in seen]
                seen.update(index.folders)
                maybe += [m for m in index.maybe if m + "/" not in seen]
                seen.update(m + "/" for m in index.maybe)
            probed = await asyncio.gather(*(self._probe(m) for m in maybe))
            found: dict[str, Index] = {}  # folders whose links lacked a slash: their pages
            for key, got in zip(maybe, probed, strict=True):
                if got is None:
                    files.setdefault(key, None)
                else:
                    found[key + "/"] = got
            deep = [f for f in [*folders, *found] if f.count("/") > MAX_DEPTH]
            if deep:
                raise StoreError(
                    f"{self._base}{deep[0]} is over {MAX_DEPTH} folders deep in the server's "
                    "folder pages: a folder that links into itself (a symlink to a parent)? "
                    "Name the objects with a manifest instead"
                )
            pages = await asyncio.gather(*(self._folder(f) for f in folders))
            level = [p for p in pages if p is not None] + list(found.values())
        if self._refused:
            refused = sorted(self._refused)
            log.warning(
                "%s: %d folders its pages link gave no page (403 or 404), so their files "
                "are not listed: %s",
                self._base,
                len(refused),
                ", ".join(refused[:5]) + (", ..." if len(refused) > 5 else ""),
            )
        return [self._row(key, size, times.get(key)) for key, size in sorted(files.items())]

    @staticmethod
    def _row(key: str, size: int | None, time: str | None) -> dict[str, str]:
        """A file's row of the listing: its key, and its size and version where the pages
        give them."""
        if size is None:
            return {"key": key}
        if time is None:
            return {"key": key, "size": str(size)}
        return {"key": key, "size": str(size), "etag": page_version(time)}

    async def _folder(self, key: str) -> Index | None:
        """A linked folder's page (a refusal noted for the warning)."""
        async with self._at_once:
            index, denied = await self._page(key)
        if denied:
            self._refused.append(key)
        return index

    async def _probe(self, key: str) -> Index | None:
        """The folder page at ``key`` and a ``/`` (a link without its slash), or None
        where there is none: ``key`` is a file."""
        async with self._at_once:
            index, _ = await self._page(key + "/")
        return index

    async def _page(self, folder: str) -> tuple[Index | None, bool]:
        """The folder page at ``folder`` (a key ending in ``/``; ``""``: the base URL) read
        by :func:`~._web_index.read_index` (None where the page links nothing below
        itself: an empty folder, or no folder page), and whether the server refused it
        (404, 403: nginx without ``autoindex``, a folder it may not read)."""
        index = None
        for accept in (FOLDER_PAGE_ACCEPT, HTML_PAGE_ACCEPT) if self._json else (HTML_PAGE_ACCEPT,):
            try:
                answer, data, landed = await self._read(folder, self._base + folder, accept)
            except (ObjectNotFound, AccessDenied):
                return None, True
            ctype = answer.get("content-type", "")
            served = _served_at(answer.get("date", ""))
            # Its links are read where the page came from (a server may redirect it
            # elsewhere: another path, another host), its keys as the folder's.
            index = await asyncio.to_thread(
                read_index, bytes(data), ctype, landed, self._base, served, folder
            )
            if index is not None or "json" not in ctype.lower():
                break
            # JSON that is no list read here (express's serve-index: names alone, folders
            # not told from files): the same page again as HTML, and every later one so.
            self._json = False
        return index, False


def _served_at(date: str) -> datetime:
    """When a page was served: its ``Date`` header, or this machine's clock where the
    answer has none that reads as one."""
    try:
        served = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return datetime.now(UTC)
    return served if served.tzinfo is not None else served.replace(tzinfo=UTC)
