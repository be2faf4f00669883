"""Web servers nobody here wrote, beside nginx (``test_nginx.py``), each in front of the
same folders: Apache httpd (``mod_autoindex``: a table with sort links and sizes rounded),
lighttpd (its ``dir-listing`` pages: a table of links, sizes rounded), Caddy (``file_server browse``: its list in JSON, with
exact sizes, to a request that accepts JSON) and Node's Express with ``serve-index`` (folder
links without their trailing ``/``; sizes in bytes on its HTML pages; the names alone in
JSON, so the loader reads its HTML instead).  A class folder and a caption folder listed by
their pages, byte ranges tiling large images, and each server's access log saying what was
asked.  Subprocesses on 127.0.0.1, started and stopped by the tests."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from PIL import Image

import asyncloader as al
from asyncloader.testing import (
    Apache,
    Caddy,
    Express,
    Lighttpd,
    Nginx,
    PythonHTTPServer,
    find_apache,
    find_caddy,
    find_express,
    find_lighttpd,
    find_nginx,
)
from asyncloader.testing._webserver import WebServer

from ._captions import WIDE, caption_folder, class_captions, class_cut, class_epoch, wide_epoch
from .conftest import N_IMAGES

# Parts small enough that the photos of the test folder (50-200 KB) take the ranged path.
PARTS = al.FetchConfig(range_threshold=96 << 10, part_size=32 << 10)


@dataclass(frozen=True)
class _Server:
    """A server under test, and what its folder pages give."""

    make: Callable[[Path], WebServer]
    sizes: bool  # its pages give each file's exact size (no HEAD)
    root_asks: int  # times the root folder page is asked (JSON first, then HTML)


_SERVERS = {
    "apache": (_Server(Apache, sizes=False, root_asks=1), find_apache, "APACHE"),
    "lighttpd": (_Server(Lighttpd, sizes=False, root_asks=1), find_lighttpd, "LIGHTTPD"),
    "caddy": (_Server(Caddy, sizes=True, root_asks=1), find_caddy, "CADDY"),
    "express": (_Server(Express, sizes=True, root_asks=2), find_express, "EXPRESS"),
}


def _servers() -> list[object]:
    """Each server, skipped where it is not installed (and ``.ci/run`` did not require it)."""
    return [
        pytest.param(
            server,
            id=name,
            marks=pytest.mark.skipif(
                find() is None and not os.environ.get(f"ASYNCLOADER_REQUIRE_{need}"),
                reason=f"{name} is not installed (.ci/run installs it)",
            ),
        )
        for name, (server, find, need) in _SERVERS.items()
    ]


@pytest.mark.parametrize("server", _servers())
def test_a_class_folder_listed_by_the_server_s_pages(
    server: _Server, jpeg_folder: Path, tmp_path: Path
) -> None:
    """No manifest, no metadata file: the server's folder pages list the class folders
    (serve-index's found behind their links without a slash, asked at the link and a
    ``/``), their images and the captions beside them.  Where the pages give sizes, no
    image is HEAD-asked; where they round them (Apache's, lighttpd's), each image is.  A filter on
    ``size`` keeps the smaller half, and an image it leaves out is never fetched.  Each
    page answered once (the root twice where the server's JSON is names alone: it is asked
    again as HTML, and every later page so).  The server stopped, the same run comes from
    the node's cache."""
    site = tmp_path / "site"
    sizes, cut, kept = class_cut(site, jpeg_folder)
    cache = tmp_path / "cache"
    with server.make(site) as web:
        got, classes, stats = class_epoch(f"{web.endpoint}/", cut, cache)
    answers = web.answers()  # all of them, now that it has stopped
    assert classes == ("cat", "dog")
    assert got == class_captions(kept) and stats.filtered_out == len(sizes) - len(kept)
    # Each page answered once (lighttpd answers 503 while its dir-listing has a few large
    # folders in hand: asked again, as a transient fault is).
    pages = Counter(a.path for a in answers if a.path.endswith("/") and a.status != 503)
    assert pages == {"/": server.root_asks, "/cat/": 1, "/dog/": 1}, pages
    assert not [a for a in answers if a.path in ("/cat", "/dog")]
    heads = set() if server.sizes else {"HEAD"}
    for key in sizes:
        asked = {a.method for a in answers if a.path == f"/{key}"}
        assert asked == (heads | {"GET"} if key in kept else heads), (key, asked)
    again, _, stats = class_epoch(f"{web.endpoint}/", cut, cache)  # the server stopped
    assert again == got and stats.requests == 0


@pytest.mark.parametrize("server", _servers())
def test_a_bucketed_caption_folder_filtered_by_width(server: _Server, tmp_path: Path) -> None:
    """A caption folder (``metadata.jsonl`` without sizes) in aspect-ratio buckets, filtered
    on the width its headers give: the metadata file read once (the listing's read is the
    dataset's: no HEAD, no second GET), each image asked once, by a range read of its first
    64 KiB that gives its size and its header (these images are small: it brings each
    whole), and nothing more — no HEAD; the cache keeps those the filter keeps, and the
    epoch reads them there; a second run on the node asks nothing."""
    cache = tmp_path / "cache"
    with server.make(caption_folder(tmp_path / "site")) as web:
        got, stats = wide_epoch(f"{web.endpoint}/", cache)
    assert got == WIDE and stats.filtered_out == 12 - len(WIDE)
    answers = web.answers()
    metadata = [(a.method, a.path) for a in answers if "metadata" in a.path]
    assert metadata == [("GET", "/metadata.jsonl")]
    jpegs = [a for a in answers if a.path.endswith(".jpg")]
    per_image = Counter((a.path, a.method) for a in jpegs)
    assert len(per_image) == 12 and set(per_image.values()) == {1}, per_image
    assert all(a.method == "GET" and a.range == "bytes=0-65535" for a in jpegs), jpegs
    again, stats = wide_epoch(f"{web.endpoint}/", cache)  # the server stopped
    assert again == WIDE and stats.requests == 0


@pytest.mark.parametrize("server", _servers())
def test_each_image_streams_once_in_ranged_parts(
    server: _Server, jpeg_folder: Path, tmp_path: Path
) -> None:
    """The server honours byte ranges: every image of a manifest (keys only: sized by HEAD)
    is fetched, the large ones in parts of ``part_size`` (206 each) that tile it: the
    ranges asked hold each image's bytes once.  (Without a cache, the next epoch's first
    batches, prefetched before the loader closed, ask some ranges again.)"""
    site = tmp_path / "site"
    site.mkdir()
    (site / "train").symlink_to(jpeg_folder, target_is_directory=True)
    keys = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    (site / "train.jsonl").write_text("".join(json.dumps({"key": k}) + "\n" for k in keys))
    images = {f"/train/{k}": (jpeg_folder / k).stat().st_size for k in keys}
    large = [path for path, size in images.items() if size > PARTS.range_threshold]
    assert large  # the folder has images that take the ranged path
    with server.make(site) as web:
        with al.ImageLoader(
            f"{web.endpoint}/train/",
            batch_size=16,
            transform=al.Resize(32),
            store=al.StoreConfig(options={"manifest": f"{web.endpoint}/train.jsonl"}),
            fetch=PARTS,
            shuffle=False,
        ) as loader:
            n = sum(len(labels) for _, labels in loader)
            stats = loader.stats()
    assert n == N_IMAGES and not stats.skipped
    gets = [a for a in web.answers() if a.method == "GET" and a.path.endswith(".jpg")]
    asked = {(a.path, a.range) for a in gets}  # each range once, whatever was sent again
    assert {path for path, _ in asked} == set(images)
    for path in large:
        assert sum(1 for p, _ in asked if p == path) == -(-images[path] // PARTS.part_size)
    assert {a.status for a in gets if a.path in large} == {206}
    # Each range's bytes in its fullest answer: a request sent again and dropped (a hedge
    # that lost, a prefetch the loader's close cancelled) is logged with the bytes sent
    # before it was dropped, and a server logs each answer as it ends, so on a loaded
    # machine a cut one can be logged before the whole one (Caddy's, once).
    fullest: dict[tuple[str, str], int] = {}
    for a in gets:
        fullest[a.path, a.range] = max(fullest.get((a.path, a.range), 0), a.body_bytes)
    assert sum(fullest.values()) == sum(images.values())  # the parts tile each image


@pytest.mark.skipif(
    find_apache() is None and not os.environ.get("ASYNCLOADER_REQUIRE_APACHE"),
    reason="apache is not installed (.ci/run installs it)",
)
def test_weak_etags_are_compared_weakly(jpeg_folder: Path, tmp_path: Path) -> None:
    """Apache gives a file modified within the last second a weak ETag (``W/"..."``), and
    a weak ETag never matches ``If-Match``: a loader that sent it had each unchanged image
    answered 412, "changed since it was listed".  Files dated in the future keep Apache's
    ETags weak throughout: the epoch reads every kept image, no answer is a 412."""
    site = tmp_path / "site"
    _, cut, kept = class_cut(site, jpeg_folder)
    later = time.time() + 3600
    for path in site.rglob("*"):
        os.utime(path, (later, later))
    with Apache(site) as web:
        head = urllib.request.Request(f"{web.endpoint}/{quote(min(kept))}", method="HEAD")
        with urllib.request.urlopen(head) as answer:
            assert answer.headers["ETag"].startswith('W/"')
        got, _, stats = class_epoch(f"{web.endpoint}/", cut, tmp_path / "cache")
    assert got == class_captions(kept) and not stats.skipped
    assert [a for a in web.answers() if a.status == 412] == []


def _every_server() -> list[object]:
    """Each server of this module, nginx with its HTML and its JSON pages, and
    ``http.server``: how each is made, whether its versions are to the second or finer
    (nginx's HTML page writes the minute), each skipped where it is not installed."""
    servers: dict[str, tuple[Callable[[Path], Any], bool, Callable[[], str | None], str]] = {
        name: (server.make, True, find, need) for name, (server, find, need) in _SERVERS.items()
    }
    servers["nginx-html"] = (
        lambda root: Nginx(root, server="autoindex on;"),
        False,
        find_nginx,
        "NGINX",
    )
    servers["nginx-json"] = (
        lambda root: Nginx(root, server="autoindex on; autoindex_format json;"),
        True,
        find_nginx,
        "NGINX",
    )
    servers["http.server"] = (PythonHTTPServer, True, lambda: sys.executable, "")
    return [
        pytest.param(
            make,
            seconds,
            id=name,
            marks=pytest.mark.skipif(
                find() is None and not os.environ.get(f"ASYNCLOADER_REQUIRE_{need}"),
                reason=f"{name} is not installed (.ci/run installs it)",
            ),
        )
        for name, (make, seconds, find, need) in servers.items()
    ]


@pytest.mark.parametrize(("make", "to_the_second"), _every_server())
def test_a_file_replaced_by_one_of_the_same_size_is_read_again(
    make: Callable[[Path], Any], to_the_second: bool, tmp_path: Path
) -> None:
    """A web folder's files have a version as an S3 object's ETag is one: the time the
    folder page says each was modified where it sizes them (nginx, Caddy, serve-index),
    else the ETag or ``Last-Modified`` of its HEAD (Apache, lighttpd, ``http.server``).  Two
    of four BMPs (their size set by their pixels) replaced by others of the same size, a
    second later: a run whose listing is made after reads them again, not their old
    bytes from the node's cache; the two left alone stay cached where the version is to
    the second (nginx's HTML page gives the minute: a file written in the minute its page
    was served is read again by each listing made in that minute)."""
    site = tmp_path / "site"
    (site / "a").mkdir(parents=True)
    names = [f"{i}.bmp" for i in range(4)]

    def paint(folder: Path, some: list[str], shade: int) -> None:
        for name in some:
            Image.new("RGB", (16, 16), (shade, 40, 80)).save(folder / "a" / name)

    def shades(url: str) -> tuple[list[int], al.Stats]:
        with al.ImageLoader(
            url,
            batch_size=4,
            labels=None,
            shuffle=False,
            transform=al.Resize(8),
            cache_dir=tmp_path / "cache",
            cache=al.CacheConfig(refresh_listing=True),
            engine=al.EngineConfig(mode="inline"),
        ) as loader:
            got = [int(x[0, 0, 0]) for images, _ in loader for x in images]
            return got, loader.stats()

    paint(site, names, 10)
    sizes = [(site / "a" / name).stat().st_size for name in names]
    with make(site) as web:
        served = getattr(web, "served", site)
        url = web.endpoint + "/"
        assert shades(url)[0] == [10] * 4
        time.sleep(1.1)  # the next second: what a version to the second tells apart
        paint(served, names[:2], 200)
        assert [(served / "a" / name).stat().st_size for name in names] == sizes
        got, stats = shades(url)
    assert got == [200, 200, 10, 10]
    assert stats.objects_fetched == 2 if to_the_second else stats.objects_fetched >= 2


@pytest.mark.skipif(
    (find_express() is None and not os.environ.get("ASYNCLOADER_REQUIRE_EXPRESS"))
    or (find_nginx() is None and not os.environ.get("ASYNCLOADER_REQUIRE_NGINX")),
    reason="Express or nginx is not installed (.ci/run installs them)",
)
def test_folder_pages_redirected_elsewhere_are_read_where_they_landed(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """A hub (nginx) that moved its folder: every URL under ``/data/`` answers a 301 to
    the same path under ``/moved/`` on another server (Express with serve-index, whose
    pages link by absolute paths).  Each folder page is read where it landed, its links
    taken there, and every image is listed with its key under the URL asked for, then
    read through the redirect: the same images and classes as from the server itself."""
    root = tmp_path / "root"
    sizes, cut, kept = class_cut(root / "moved" / "data", jpeg_folder)
    with Express(root) as there:
        hop = f"location /data/ {{ return 301 {there.endpoint}/moved$request_uri; }}"
        with Nginx(tmp_path, server=hop) as hub:
            got, classes, stats = class_epoch(f"{hub.endpoint}/data/", cut, tmp_path / "cache")
    assert classes == ("cat", "dog")
    assert got == class_captions(kept) and stats.filtered_out == len(sizes) - len(kept)
    pages = {a.path for a in there.answers() if a.path.endswith("/")}
    assert {"/moved/data/", "/moved/data/cat/", "/moved/data/dog/"} <= pages
    assert {a.path for a in hub.answers()} >= {f"/data/{k}" for k in kept}
