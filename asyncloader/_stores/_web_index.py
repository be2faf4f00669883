"""A web server's folder pages, read as a listing (pure): nginx's ``autoindex`` (HTML, JSON
or XML), Caddy's ``file_server browse`` (its list in JSON, asked for by the request's
``Accept``), Python's ``http.server``, lighttpd's and Apache's, and any page of links.

A plain web server has no listing API, but most serve a folder without an ``index.html``
as a page of links to what it holds, and a user who points a loader at such a folder
expects what ``fsspec``'s ``HTTPFileSystem`` gives: the files it links, and the folders'
files below it.  :func:`read_index` turns one such page into the files and folders it
names below the page; :mod:`._web` walks the folders.

Only links below the page itself count: ``../``, a link to another host, to a folder
elsewhere on the server, or with a query or fragment (Apache's sort links, ``?C=N;O=D``)
are not the folder's.  nginx's JSON and XML pages and Caddy's JSON give each file's exact
size, and so do nginx's HTML pages, in a row of their own after each link
(``autoindex_exact_size on``, its default; under ``off``, only the sizes below 10,000
bytes are written in full, the rest rounded to a ``K``, ``M`` or ``G``).  Any other
page's sizes are not read (Apache's and lighttpd's are rounded, ``http.server`` gives
none): those files are sized as a manifest's files without sizes are.

Where a page gives a file's size, it also gives the time the file was last modified
(nginx's pages, to the minute in HTML and the second in JSON and XML; Caddy's JSON, to the
nanosecond; serve-index's HTML, to the second): kept as the page writes it (nginx's
minute with the second the page was served, where that minute had not ended then:
:func:`_nginx_time`), it is the file's version in the listing (``Index.times``), so that a
file replaced by another of the same size is a new object to the cache, as an S3 object's
new ETag makes it.
"""

from __future__ import annotations

import html
import json
import posixpath
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from urllib.parse import quote, unquote, urljoin, urlsplit

__all__ = ["MAX_DEPTH", "Index", "read_index"]

# A relative name without a scheme, query or fragment, not starting with "/" or ".".
_PLAIN = re.compile(r"[^/?#:.][^?#:]*")

# nginx's HTML page (ngx_http_autoindex_module): from "<hr><pre>" on, one line per entry,
# its link (the href percent-encoded, the name HTML-escaped: no "<" of its own), then the
# modification time ("06-Dec-2026 14:41", to the minute) and the size: a number of bytes,
# "-" for a folder, or (autoindex_exact_size off) a number and K, M or G — only a plain
# number is read, and the time with it.  A name with a line break in it breaks its row:
# that file goes unsized.
_NGINX_PAGE = b"<hr><pre>"
_NGINX_ROW = re.compile(
    r'(?:^|(?<=<hr><pre>))<a href="([^"]*)">[^\n]*?</a>'  # the link, from a row's start
    r"\s+(\d{2}-[A-Z][a-z]{2}-\d{4} \d{2}:\d{2})\s+(\d+)\r?$",  # the date, the size, its end
    re.MULTILINE,
)

# express's serve-index (its default template): a list of links, each with spans of the
# name, the size in bytes (empty for a folder) and the date ("12/6/2026 6:29:33 PM").
_SERVE_INDEX_PAGE = b'<ul id="files"'
_SERVE_INDEX_ROW = re.compile(
    r'<a href="([^"]*)"[^>]*><span class="name">[^<]*</span><span class="size">(\d+)</span>'
    r'(?:<span class="date">([^<]*)</span>)?'
)

_MONTHS = {
    name: i + 1
    for i, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    )
}

MAX_DEPTH = 32
"""Folders below the base URL that a walk of folder pages goes down at most: deeper is a
server whose folders link into themselves (a symlink to a parent, served as a folder),
where a walk would never end."""


@dataclass(frozen=True, slots=True)
class Index:
    """What one folder page names below itself.

    Attributes:
        files: Each file's key (relative to the listing's base URL, unquoted, POSIX) and
            its size in bytes where the page gives it exactly (else None).
        folders: Each folder's key, ending in ``/``, relative to the base URL.
        maybe: Keys an HTML page links without a trailing ``/`` and without an extension
            in their last part: a folder whose link lacks its slash (express's
            ``serve-index`` writes ``/cat`` for the folder ``cat/``), or a file without
            an extension.  The walk asks for the folder page at the key and a ``/``.
        times: Each file whose size the page gives exactly, by key, with the time it was
            last modified as the page writes it, where it writes one (the file's version:
            see the module's docstring).
    """

    files: tuple[tuple[str, int | None], ...]
    folders: tuple[str, ...]
    maybe: tuple[str, ...] = ()
    times: tuple[tuple[str, str], ...] = ()


class _Links(HTMLParser):
    """Every ``href`` of an ``<a>`` in a page, in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            for name, value in attrs:
                if name == "href" and value:
                    self.hrefs.append(value)


class _Below:
    """Keys of the URLs below one folder page: the page's and the base's parts split and
    decoded once, not for each of a large folder's links."""

    __slots__ = ("_origin", "_page", "_page_key", "_page_path")

    def __init__(self, page: str, base: str, key: str | None = None) -> None:
        at = urlsplit(page)
        self._page = page
        self._origin = (at.scheme, at.netloc)
        self._page_path = unquote(at.path)
        # The page's key: its place below the base, unless it was served from elsewhere.
        below = self._page_path[len(unquote(urlsplit(base).path)) :]
        self._page_key = below if key is None else key

    def href(self, href: str) -> str | None:
        """The key of a link's ``href`` on the page (see :meth:`key`).  A plain relative
        name (``cat.jpg``, ``a%20b/``: what index pages write) is joined without
        ``urljoin``, a hundred thousand of them in a fraction of its time."""
        if _PLAIN.fullmatch(href):
            name = unquote(href)
            if "//" not in name and "/." not in "/" + name:
                return self._page_key + name
        return self.key(urljoin(self._page, href))

    def key(self, url: str) -> str | None:
        """The key of ``url`` relative to the base where it lies strictly below the page
        (same scheme and host, no query, no fragment); else None."""
        parts = urlsplit(url)
        if parts.query or parts.fragment or (parts.scheme, parts.netloc) != self._origin:
            return None
        path = unquote(parts.path)
        if len(path) <= len(self._page_path) or not path.startswith(self._page_path):
            return None
        key = self._page_key + path[len(self._page_path) :]
        # "a/./b" or "a//b" is not a file of its own: a key is the normalised path.
        normal = posixpath.normpath(key) + ("/" if key.endswith("/") else "")
        if normal.startswith(("../", "/")) or normal in (".", "./", ".."):
            return None
        return normal


_Named = tuple[str, bool, int | None, str | None]
"""A folder page's entry read from JSON or XML: its name, whether it is a folder, and a
file's size and modification time where the page gives them."""


def _names(body: bytes, ctype: str) -> list[_Named] | None:
    """nginx's ``autoindex_format json`` or ``xml`` page, or Caddy's ``browse`` list in JSON,
    as (name, is a folder, size, time); None where the page is none of them."""
    text = body.lstrip()
    if "json" in ctype or text.startswith(b"["):
        try:
            entries = json.loads(body)
        except ValueError:
            return None
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
        ):
            return None
        read = [(_json_entry(e), e.get("type") == "other") for e in entries]
        if any(entry is None and not other for entry, other in read):
            return None  # a list in a form not read here: not taken for an empty folder
        return [entry for entry, _ in read if entry is not None]
    if "xml" in ctype or text.startswith(b"<?xml"):
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return None
        if root.tag != "list":
            return None
        return [
            (e.text or "", e.tag == "directory", _size(e.get("size")), e.get("mtime"))
            for e in root
            if e.tag in ("file", "directory") and e.text
        ]
    return None


def _json_entry(e: dict[str, object]) -> _Named | None:
    """One entry of a JSON folder page: nginx's (``type`` ``"file"`` or ``"directory"``,
    its time ``mtime``) or Caddy's (``is_dir``, a folder's name ending in ``/``; its time
    ``mod_time``), as (name, is a folder, size and time where it is a file's); None for any
    other entry (nginx's ``"other"``: a socket, say)."""
    name = str(e["name"])
    if isinstance(e.get("is_dir"), bool) and "type" not in e:  # Caddy's
        folder = bool(e["is_dir"])
        name = name.removesuffix("/") if folder else name
    elif e.get("type") in ("file", "directory"):
        folder = e["type"] == "directory"
    else:
        return None
    if folder:
        return name, True, None, None
    time = e.get("mtime", e.get("mod_time"))
    return name, False, _size(e.get("size")), time if isinstance(time, str) else None


def _size(value: object) -> int | None:
    """An exact size from a page, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _page_sizes(
    body: bytes, text: str, served: datetime | None
) -> dict[str, tuple[int, str | None]]:
    """The files on nginx's or express's ``serve-index`` HTML page, by href as a page's
    parser reads it (empty for any other page): each one's exact size, with its
    modification time where the page gives it (nginx's: see :func:`_nginx_time`).
    ``served``: when the page was served (its ``Date``)."""
    if _NGINX_PAGE in body:
        return {
            html.unescape(m[1]).strip(): (int(m[3]), _nginx_time(m[2], served))
            for m in _NGINX_ROW.finditer(text)
        }
    if _SERVE_INDEX_PAGE in body:
        return {
            html.unescape(m[1]).strip(): (int(m[2]), html.unescape(m[3]) if m[3] else None)
            for m in _SERVE_INDEX_ROW.finditer(text)
        }
    return {}


def _nginx_time(time: str, served: datetime | None) -> str:
    """A file's time on nginx's HTML page (``06-Dec-2026 14:41``, to the minute, in GMT:
    ``autoindex_localtime off``, its default) as the file's version: the minute alone where
    it had ended when the page was served (``served``: the page's ``Date``; None, unknown:
    the minute alone).  A file written in the minute its page was served may be written
    again in that minute, the same size, and its row would not change: its version is then
    the minute and the second the page was served, so that a later listing gives it
    another, and the cache fetches it again rather than keep bytes it cannot tell from a
    replacement's.  (A file written again within the second the page was served is beyond
    any version nginx gives: its ETag is to the second too.)"""
    if served is None:
        return time
    month = _MONTHS.get(time[3:6])
    try:  # read by hand, not by strptime: its %b is the locale's month names
        if month is None:
            raise ValueError(time)
        minute = datetime(
            int(time[7:11]), month, int(time[:2]), int(time[12:14]), int(time[15:17]), tzinfo=UTC
        )
    except ValueError:
        minute = served  # a time not read here: taken as recent
    if served >= minute + timedelta(minutes=1):
        return time
    return f"{time}, listed {served.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def read_index(
    body: bytes,
    ctype: str,
    page: str,
    base: str,
    served: datetime | None = None,
    page_key: str | None = None,
) -> Index | None:
    """The files and folders that the folder page ``body`` (served at ``page``, with the
    ``Content-Type`` ``ctype``, at the time ``served``: its ``Date``) names below itself, as
    keys relative to ``base``; None where the page is not a folder page at all (no link
    below it, and not nginx's JSON or XML).
    ``page`` and ``base`` are URLs of folders (ending in ``/``).  ``page_key``: the page's
    own key under ``base`` where it was served from elsewhere (``page``: the URL a redirect
    took it to), its links read there and their keys made below ``page_key``."""
    named = _names(body, ctype.lower())
    links: list[tuple[str, int | None, str | None]]  # href, size, time
    if named is not None:
        links = [
            (quote(name) + ("/" if folder else ""), size, time)
            for name, folder, size, time in named
        ]
    else:
        parser = _Links()
        text = body.decode("utf-8", errors="replace")
        try:
            parser.feed(text)
            parser.close()
        except AssertionError:  # an HTMLParser's complaint about a page it cannot read
            return None
        sizes = _page_sizes(body, text, served)
        hrefs = [href.strip() for href in parser.hrefs]
        links = [(h, *sizes.get(h, (None, None))) for h in hrefs]
    files: dict[str, int | None] = {}
    times: dict[str, str] = {}
    folders: dict[str, None] = {}
    maybe: dict[str, None] = {}
    below = _Below(page, base, page_key)
    for href, size, time in links:
        key = below.href(href)
        if key is None:
            continue
        if key.endswith("/"):
            folders[key] = None
        elif named is None and size is None and "." not in key.rpartition("/")[2]:
            maybe[key] = None
        elif key not in files:
            files[key] = size
            if size is not None and time:
                times[key] = time.strip()
    maybe = {key: None for key in maybe if key not in files and key + "/" not in folders}
    if named is None and not files and not folders and not maybe:
        return None
    return Index(tuple(files.items()), tuple(folders), tuple(maybe), tuple(times.items()))
