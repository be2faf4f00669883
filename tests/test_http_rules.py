"""The HTTP rules the stores share, as pure functions: which proxy a URL goes through (the
environment as curl and requests read it, NO_PROXY included), a Content-Encoding undone,
a served manifest's charset, and a web server's folder page read as a listing."""

from __future__ import annotations

import gzip
import html
import json
import zlib
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

import asyncloader as al
from asyncloader._stores._http import proxy_for, redirected
from asyncloader._stores._http_objects import (
    answer_version,
    decoded,
    page_version,
    version_check,
    whole_answer,
)
from asyncloader._stores._web import _as_utf8
from asyncloader._stores._web_index import Index, read_index

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_the_environment_s_proxy_by_scheme(no_proxies: pytest.MonkeyPatch) -> None:
    assert proxy_for("https://bucket.s3.amazonaws.com/k") is None
    no_proxies.setenv("HTTPS_PROXY", "http://p:3128")
    no_proxies.setenv("http_proxy", "http://plain:8080")
    assert proxy_for("https://bucket.s3.amazonaws.com/k") == "http://p:3128"
    assert proxy_for("http://minio.lan:9000/b") == "http://plain:8080"
    # A store option wins; "" means none.
    assert proxy_for("https://x.example/k", "http://other:1") == "http://other:1"
    assert proxy_for("https://x.example/k", "") is None


@pytest.mark.parametrize(
    ("no_proxy", "url", "bypassed"),
    [
        ("*", "https://anything.example/k", True),
        ("example.com", "https://example.com/k", True),
        ("example.com", "https://data.example.com/k", True),
        (".example.com", "https://data.example.com/k", True),
        ("example.com", "https://notexample.com/k", False),
        ("10.0.0.0/8", "http://10.1.2.3:9000/b", True),
        ("10.0.0.0/8", "http://11.1.2.3:9000/b", False),
        ("127.0.0.1", "http://127.0.0.1:9000/b", True),
        ("minio.lan:9000", "http://minio.lan:9000/b", True),
        ("minio.lan:9000", "http://minio.lan:9001/b", False),
        (" localhost , .invalid ", "http://data.invalid:1/b", True),
        ("", "http://data.invalid:1/b", False),
    ],
)
def test_no_proxy_as_curl_reads_it(
    no_proxies: pytest.MonkeyPatch, no_proxy: str, url: str, bypassed: bool
) -> None:
    no_proxies.setenv("ALL_PROXY", "http://p:3128")
    no_proxies.setenv("NO_PROXY", no_proxy)
    assert (proxy_for(url) is None) == bypassed


@given(st.binary(max_size=4096), st.sampled_from(["gzip", "x-gzip", "deflate", "raw-deflate"]))
def test_a_compressed_answer_is_undone(data: bytes, how: str) -> None:
    if how in ("gzip", "x-gzip"):
        body = gzip.compress(data)
    elif how == "deflate":
        body = zlib.compress(data)
    else:  # raw deflate, as some servers send for "deflate"
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        body = packer.compress(data) + packer.flush()
    coding = "deflate" if how == "raw-deflate" else how
    assert bytes(decoded(body, {"content-encoding": coding}, what="o", key="o")) == data


def test_encodings_as_they_are_or_refused() -> None:
    assert decoded(b"abc", {}, what="o", key="o") == b"abc"
    assert decoded(b"abc", {"content-encoding": "identity"}, what="o", key="o") == b"abc"
    with pytest.raises(al.StoreError, match="Content-Encoding: br"):
        decoded(b"abc", {"content-encoding": "br"}, what="o", key="o")
    with pytest.raises(al.TransientStoreError, match="does not decompress"):
        decoded(gzip.compress(b"x" * 100)[:20], {"content-encoding": "gzip"}, what="o", key="o")


def test_a_manifest_in_the_charset_its_server_names() -> None:
    text = '{"key": "café/1.jpg"}\n'
    latin = text.encode("latin-1")
    assert _as_utf8(latin, {"content-type": "text/plain; charset=ISO-8859-1"}) == text.encode()
    assert _as_utf8(text.encode(), {"content-type": "application/json"}) == text.encode()
    with pytest.raises(al.StoreError, match="does not decode"):
        _as_utf8(b"\xff", {"content-type": "text/plain; charset=no-such-charset"})


@given(st.integers(1, 4096), st.integers(0, 4096), st.integers(1, 4096))
def test_a_whole_answer_is_told_from_a_part(size: int, start: int, length: int) -> None:
    start = min(start, size - 1)
    end = min(start + length, size)
    assert not whole_answer(b"x" * (end - start), start, end, size)  # the part asked for
    assert whole_answer(b"x" * size, start, end, size) == (end - start != size)
    assert not whole_answer(b"x" * size, 0, None, size)  # no range asked: no whole answer


# A file or folder name as a server's folder holds it: any text without "/" or NUL (the
# names "." and ".." are the folder and its parent, not entries).
NAMES = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"),
    min_size=1,
    max_size=12,
).filter(lambda n: n not in (".", ".."))


def _nginx_html(files: list[str], folders: list[str], sizes: list[int], exact: bool) -> bytes:
    """A page as nginx's autoindex writes it (``../`` first, hrefs percent-encoded, names
    HTML-escaped, each name padded to 50 columns, then the date and the size: in bytes,
    or, not ``exact`` (``autoindex_exact_size off``), bytes below 10,000 and a rounded K
    above)."""

    def row(href: str, name: str, size: str) -> str:
        pad = " " * max(0, 50 - len(name))
        return f'<a href="{href}">{html.escape(name)}</a>{pad} 06-Dec-2026 14:41 {size}\r\n'

    rows = ['<a href="../">../</a>\r\n']
    rows += [row(f"{quote(d)}/", d + "/", "-".rjust(19 if exact else 6)) for d in folders]
    for f, n in zip(files, sizes, strict=True):
        shown = str(n).rjust(19) if exact or n <= 9999 else f"{(n + 512) // 1024:6d}K"
        rows.append(row(quote(f), f, shown))
    body = "<html>\r\n<head><title>Index of /x/</title></head>\r\n<body>\r\n"
    body += "<h1>Index of /x/</h1><hr><pre>"
    return (body + "".join(rows) + "</pre><hr></body>\r\n</html>\r\n").encode()


def _http_server_html(files: list[str], folders: list[str]) -> bytes:
    """A page as Python's ``http.server`` writes it (a list, folders with a trailing ``/``
    in both the href and the text)."""
    items = [f'<li><a href="{quote(d)}/">{html.escape(d)}/</a></li>' for d in folders]
    items += [f'<li><a href="{quote(f)}">{html.escape(f)}</a></li>' for f in files]
    return ("<!DOCTYPE HTML><html><body><ul>" + "".join(items) + "</ul></body></html>").encode()


@given(
    files=st.lists(NAMES, max_size=6, unique=True),
    folders=st.lists(NAMES, max_size=4, unique=True),
    depth=st.sampled_from(["", "a b/", "ü/%25/"]),
    sizes=st.lists(st.integers(0, 3 * 10**9), min_size=6, max_size=6),
)
def test_a_folder_page_lists_what_it_links_below_itself(
    files: list[str], folders: list[str], depth: str, sizes: list[int]
) -> None:
    """Whatever the names, each of the servers' page kinds gives back exactly the files and
    folders in it, keyed below the base URL; nginx's pages and Caddy's JSON with each size
    they write exactly (its HTML rows: every one, or, rounded, those below 10,000 bytes; a name with a
    line break breaks its row, and goes unsized)."""
    folders = [d for d in folders if d not in files]
    sizes = sizes[: len(files)]
    base = "http://127.0.0.1:8080/data/"
    page = base + quote(depth)
    want_folders = {depth + d + "/" for d in folders}

    def shown(exact: bool) -> dict[str, int | None]:
        return {
            depth + f: n if (exact or n <= 9999) and not _breaks(f) else None
            for f, n in zip(files, sizes, strict=True)
        }

    for body, ctype, want in (
        (_nginx_html(files, folders, sizes, True), "text/html", shown(True)),
        (_nginx_html(files, folders, sizes, False), "text/html", shown(False)),
        (
            _http_server_html(files, folders),
            "text/html; charset=utf-8",
            dict.fromkeys((depth + f for f in files), None),
        ),
    ):
        index = read_index(body, ctype, page, base)
        if not files and not folders:
            assert index is None  # no link below the page: not a folder page
            continue
        assert index is not None
        # A file with no size and no extension may be a folder whose link lacks its slash:
        # the walk asks (maybe); every other is a file.
        assert all(
            m not in dict(index.files) and "." not in m.rpartition("/")[2] for m in index.maybe
        )
        assert {**dict(index.files), **dict.fromkeys(index.maybe)} == want
        assert set(index.folders) == want_folders
    entries = [{"name": d, "type": "directory", "mtime": "x"} for d in folders]
    entries += [{"name": f, "type": "file", "mtime": "x", "size": i} for i, f in enumerate(files)]
    index = read_index(json.dumps(entries).encode(), "application/json", page, base)
    assert index is not None
    assert dict(index.files) == {depth + f: i for i, f in enumerate(files)}
    assert set(index.folders) == want_folders
    caddy = [{"name": d + "/", "size": 4096, "is_dir": True, "is_symlink": False} for d in folders]
    caddy += [{"name": f, "size": i, "is_dir": False, "mode": 420} for i, f in enumerate(files)]
    index = read_index(json.dumps(caddy).encode(), "application/json; charset=utf-8", page, base)
    assert index is not None  # Caddy's list, as it answers a request that accepts JSON
    assert dict(index.files) == {depth + f: i for i, f in enumerate(files)}
    assert set(index.folders) == want_folders
    xml = "".join(f"<directory>{html.escape(d)}</directory>" for d in folders)
    xml += "".join(f'<file size="{i}">{html.escape(f)}</file>' for i, f in enumerate(files))
    if all(n.isprintable() for n in files + folders):  # XML 1.0 has no control characters
        index = read_index(
            f'<?xml version="1.0"?><list>{xml}</list>'.encode(), "text/xml", page, base
        )
        assert index is not None and dict(index.files) == {
            depth + f: i for i, f in enumerate(files)
        }


def _breaks(name: str) -> bool:
    """Whether a name breaks its row on nginx's page, read line by line ("\\n" in it)."""
    return "\n" in name


def test_a_page_that_only_looks_like_nginx_s_gives_no_sizes() -> None:
    """A row's number is read as a size only on nginx's own page (its ``<hr><pre>``, the
    date before the number): the same rows on another page, or a number without the date,
    size nothing."""
    row = '<a href="a.jpg">a.jpg</a>   06-Dec-2026 14:41   675\n'
    page = "http://h/x/"
    nginx = read_index(f"<hr><pre>{row}</pre>".encode(), "text/html", page, page)
    assert nginx == Index(
        files=(("a.jpg", 675),), folders=(), times=(("a.jpg", "06-Dec-2026 14:41"),)
    )
    other = read_index(f"<pre>{row}</pre>".encode(), "text/html", page, page)
    assert other == Index(files=(("a.jpg", None),), folders=())
    dateless = '<hr><pre><a href="a.jpg">a.jpg</a>     675\n</pre>'
    assert read_index(dateless.encode(), "text/html", page, page) == other


def test_a_page_s_times_are_its_files_versions() -> None:
    """Where a page sizes a file, the time it gives the file is its version: nginx's HTML
    minute alone once that minute had ended when the page was served (its ``Date``), else
    with the second the page was served, so that each listing made within the minute
    versions the file anew; nginx's JSON and XML times, Caddy's ``mod_time``, serve-index's
    date, as written.  A folder, or a file the page does not size, has none."""
    page = "http://h/x/"
    row = '<a href="a.jpg">a.jpg</a>   06-Dec-2026 14:41   675\n<a href="d/">d/</a>  06-Dec-2026 14:41  -\n'
    body = f"<hr><pre>{row}</pre>".encode()

    def times(served: datetime) -> tuple[tuple[str, str], ...]:
        index = read_index(body, "text/html", page, page, served)
        assert index is not None and index.folders == ("d/",)
        return index.times

    later = datetime(2026, 12, 6, 14, 42, 0, tzinfo=UTC)
    assert times(later) == times(later + timedelta(days=3)) == (("a.jpg", "06-Dec-2026 14:41"),)
    within = [datetime(2026, 12, 6, 14, 41, s, tzinfo=UTC) for s in (0, 30, 59)]
    assert [times(t) for t in within] == [
        (("a.jpg", f"06-Dec-2026 14:41, listed 2026-12-06T14:41:{s:02}Z"),) for s in (0, 30, 59)
    ]
    ahead = datetime(2026, 12, 6, 9, 41, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert times(ahead) == (("a.jpg", "06-Dec-2026 14:41, listed 2026-12-06T14:41:30Z"),)
    nginx_json = (
        b'[{"name":"a.jpg","type":"file","mtime":"Sun, 06 Dec 2026 18:29:33 GMT","size":4}]'
    )
    nginx_xml = b'<?xml version="1.0"?><list><file mtime="2026-12-06T18:29:33Z" size="4">a.jpg</file></list>'
    caddy = (
        b'[{"name":"a.jpg","size":4,"mod_time":"2026-12-06T18:29:33.844625022Z","is_dir":false}]'
    )
    unsized = b'[{"name":"a.jpg","type":"file","mtime":"Sun, 06 Dec 2026 18:29:33 GMT"}]'
    for page_body, ctype, want in (
        (nginx_json, "application/json", "Sun, 06 Dec 2026 18:29:33 GMT"),
        (nginx_xml, "text/xml", "2026-12-06T18:29:33Z"),
        (caddy, "application/json", "2026-12-06T18:29:33.844625022Z"),
        (unsized, "application/json", None),
    ):
        index = read_index(page_body, ctype, page, page, later)
        assert index is not None and dict(index.times).get("a.jpg") == want, page_body


def test_an_object_s_version_is_its_etag_else_its_last_modified() -> None:
    """The version of an object from an answer: its ETag (weak or strong, unquoted), else
    its ``Last-Modified`` (no ETag can hold a space: the two cannot be confused), else
    none; what a GET's answer must then carry, and where; a folder page's time is checked
    against nothing."""
    modified = "Sun, 06 Dec 2026 18:29:33 GMT"
    assert answer_version({"etag": 'W/"5f-1a"', "last-modified": modified}) == "5f-1a"
    assert answer_version({"last-modified": modified}) == "last-modified " + modified
    assert answer_version({}) == ""
    assert version_check("5f-1a") == ("5f-1a", "etag")
    assert version_check(answer_version({"last-modified": modified})) == (
        modified,
        "last-modified",
    )
    assert version_check(page_version("06-Dec-2026 14:41")) == ("", "etag")
    assert version_check("") == ("", "etag")


def test_a_redirect_keeps_credentials_on_its_origin_alone() -> None:
    """Where a redirect goes (absolute, or relative to the URL that answered it), and the
    headers the request takes there: all of them on the same origin, none that hands over
    a credential on another (a hub's token is not for the CDN it sends files to), as
    aiohttp and requests do."""
    url = URL("https://hub.example/datasets/x/resolve/main/a.jpg")
    headers = {"Authorization": "Bearer t0ken", "Cookie": "s=1", "Range": "bytes=0-9"}
    there, kept = redirected(url, "/cdn/a.jpg?sig=abc", headers)
    assert str(there) == "https://hub.example/cdn/a.jpg?sig=abc" and kept == headers
    there, kept = redirected(url, "https://cdn.example/a%20b.jpg?sig=a%2Fb", headers)
    assert str(there) == "https://cdn.example/a%20b.jpg?sig=a%2Fb"
    assert kept == {"Range": "bytes=0-9"}
    there, kept = redirected(url, "http://hub.example/datasets/x/a.jpg", headers)
    assert there.scheme == "http" and kept == {"Range": "bytes=0-9"}  # another origin


def test_links_without_a_slash_or_an_extension_are_asked_as_folders() -> None:
    """express's serve-index links a folder without its slash (``/data/cat``) and writes
    each file's size: a link with no extension and no slash may be a folder (``maybe``,
    which the walk asks for at the link and a ``/``); a file is a file, with its size; a
    JSON answer of names alone (serve-index's to a request preferring JSON) is no list
    read here, nor a list of entries in some other form."""
    page = base = "http://h/data/"

    def row(href: str, name: str, size: str) -> str:
        return (
            f'<li><a href="{href}" class="" title="{name}"><span class="name">{name}</span>'
            f'<span class="size">{size}</span><span class="date">12/6/2026</span></a></li>'
        )

    rows = [
        row("/data", "data", ""),
        row("/data/cat", "cat", ""),
        row("/data/README", "README", ""),
    ]
    rows += [row("/data/a%20b.jpg", "a b.jpg", "12531"), row("/data/c.jpg", "c.jpg", "")]
    body = f'<ul id="files" class="view-tiles">{"".join(rows)}</ul>'.encode()
    assert read_index(body, "text/html; charset=utf-8", page, base) == Index(
        files=(("a b.jpg", 12531), ("c.jpg", None)),
        folders=(),
        maybe=("cat", "README"),
        times=(("a b.jpg", "12/6/2026"),),
    )
    # A plain page's extensionless link is asked too; one with its slash is a folder.
    plain = b'<a href="cat">cat</a><a href="cat/">cat/</a><a href="LICENSE">LICENSE</a>'
    assert read_index(plain, "text/html", page, base) == Index(
        files=(), folders=("cat/",), maybe=("LICENSE",)
    )
    for other in (b'["a.jpg", "cat"]', b'[{"name": "a.jpg", "type": "f"}]', b'{"files": []}'):
        assert read_index(other, "application/json", page, base) is None, other


def test_links_that_are_not_the_folder_s_are_left_out() -> None:
    """The parent, the server's root, another host, a sibling folder, a query (Apache's
    sort links) or a fragment, and the page itself: none of them is the folder's."""
    base = "https://host/data/"
    page = base + "cats/"
    hrefs = [
        "../",
        "/",
        "/data/",
        "/data/dogs/1.jpg",
        "https://other/data/cats/1.jpg",
        "http://host/data/cats/1.jpg",  # another scheme: another origin
        "?C=N;O=D",
        "1.jpg?download=1",
        "#top",
        "./",
        "",
        "a/../../dogs/2.jpg",
        "1.jpg",
        "/data/cats/2.jpg",
        "https://host/data/cats/small/",
        "./3.jpg",
    ]
    body = "".join(f'<a href="{h}">x</a>' for h in hrefs).encode()
    index = read_index(body, "text/html", page, base)
    assert index == Index(
        files=(("cats/1.jpg", None), ("cats/2.jpg", None), ("cats/3.jpg", None)),
        folders=("cats/small/",),
    )
    assert read_index(b"<html><a href='../'>up</a></html>", "text/html", page, base) is None
    assert read_index(b"not a page at all", "text/plain", page, base) is None
