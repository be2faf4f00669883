"""lighttpd, a second web server nobody here wrote, in front of the same folders as nginx:
its folder pages (``mod_dirlisting``: a table of links, sizes rounded to a tenth of a K,
the kind Apache and most small servers write) list a class folder and a caption folder,
its byte ranges serve the large images in parts and the headers' reads, and its access log
says what was asked.  Subprocesses on 127.0.0.1, started and stopped by the tests."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import Lighttpd, find_lighttpd

from ._captions import WIDE, caption_folder, class_captions, class_cut, class_epoch, wide_epoch
from .conftest import N_IMAGES

pytestmark = pytest.mark.skipif(
    find_lighttpd() is None and not os.environ.get("ASYNCLOADER_REQUIRE_LIGHTTPD"),
    reason="lighttpd is not installed (apt-get install lighttpd; .ci/run installs it)",
)

# Parts small enough that the photos of the test folder (50-200 KB) take the ranged path.
PARTS = al.FetchConfig(range_threshold=96 << 10, part_size=32 << 10)


def test_a_class_folder_listed_by_lighttpd_s_pages(jpeg_folder: Path, tmp_path: Path) -> None:
    """No manifest, no metadata file: lighttpd's folder pages list the class folders, their
    images and the captions beside them.  Its sizes are rounded ("12.2K"), so none is read
    from the page: each image is sized by a HEAD, then a filter on ``size`` keeps the
    smaller half, and an image it leaves out is never fetched.  lighttpd stopped, the same
    run comes from the node's cache."""
    site = tmp_path / "site"
    sizes, cut, kept = class_cut(site, jpeg_folder)
    cache = tmp_path / "cache"
    with Lighttpd(site) as server:
        got, classes, stats = class_epoch(f"{server.endpoint}/", cut, cache)
    answers = server.answers()  # all of them, now that it has stopped
    assert classes == ("cat", "dog")
    want = class_captions(kept)
    assert got == want and stats.filtered_out == len(sizes) - len(kept)
    pages = {a.path for a in answers if a.path.endswith("/")}
    assert pages == {"/", "/cat/", "/dog/"}
    for key in sizes:
        asked = {a.method for a in answers if a.path == f"/{key}"}
        assert asked == ({"HEAD", "GET"} if key in kept else {"HEAD"}), (key, asked)
    assert all(a.status in (200, 206, 404) for a in answers)
    again, _, stats = class_epoch(f"{server.endpoint}/", cut, cache)  # lighttpd stopped
    assert again == want and stats.requests == 0


def test_each_image_streams_once_in_ranged_parts(jpeg_folder: Path, tmp_path: Path) -> None:
    """lighttpd honours byte ranges: every image of a manifest (keys only: sized by HEAD) is
    fetched, the large ones in parts of ``part_size`` (206 each) that tile it: the ranges
    asked hold each image's bytes once.  (Without a cache, the next epoch's first batches,
    prefetched before the loader closed, ask some ranges again.)"""
    site = tmp_path / "site"
    site.mkdir()
    (site / "train").symlink_to(jpeg_folder, target_is_directory=True)
    keys = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    (site / "train.jsonl").write_text("".join(json.dumps({"key": k}) + "\n" for k in keys))
    images = {f"/train/{k}": (jpeg_folder / k).stat().st_size for k in keys}
    large = [path for path, size in images.items() if size > PARTS.range_threshold]
    assert large  # the folder has images that take the ranged path
    with Lighttpd(site) as server:
        with al.ImageLoader(
            f"{server.endpoint}/train/",
            batch_size=16,
            transform=al.Resize(32),
            store=al.StoreConfig(options={"manifest": f"{server.endpoint}/train.jsonl"}),
            fetch=PARTS,
            shuffle=False,
        ) as loader:
            n = sum(len(labels) for _, labels in loader)
            stats = loader.stats()
    assert n == N_IMAGES and not stats.skipped
    gets = [a for a in server.answers() if a.method == "GET" and a.path.endswith(".jpg")]
    asked = {(a.path, a.range) for a in gets}  # each range once, whatever was sent again
    assert {path for path, _ in asked} == set(images)
    for path in large:
        assert sum(1 for p, _ in asked if p == path) == -(-images[path] // PARTS.part_size)
    assert {a.status for a in gets if a.path in large} == {206}
    first: dict[tuple[str, str], int] = {}  # each range's bytes, as first answered
    for a in gets:
        first.setdefault((a.path, a.range), a.body_bytes)
    assert sum(first.values()) == sum(images.values())  # the parts tile each image


def test_a_bucketed_caption_folder_filtered_by_width(tmp_path: Path) -> None:
    """A caption folder (``metadata.jsonl`` without sizes) in aspect-ratio buckets, filtered
    on the width its headers give: the metadata file read once (the listing's read is the
    dataset's: no HEAD, no second GET), each image sized by a HEAD and read once, by a range
    read for its header (these images are small: it brings each whole), and nothing more —
    the cache keeps those the filter keeps, and the epoch reads them there; a second run on
    the node asks nothing."""
    site = caption_folder(tmp_path / "site")
    cache = tmp_path / "cache"
    with Lighttpd(site) as server:
        got, stats = wide_epoch(f"{server.endpoint}/", cache)
    assert got == WIDE and stats.filtered_out == 12 - len(WIDE)
    answers = server.answers()
    assert [(a.method, a.path) for a in answers if "metadata" in a.path] == [
        ("GET", "/metadata.jsonl")
    ]
    jpegs = [a for a in answers if a.path.endswith(".jpg")]
    per_image = Counter((a.path, a.method) for a in jpegs)
    assert len(per_image) == 24 and set(per_image.values()) == {1}, per_image
    assert all(a.range.startswith("bytes=0-") for a in jpegs if a.method == "GET")
    again, stats = wide_epoch(f"{server.endpoint}/", cache)  # lighttpd stopped
    assert again == WIDE and stats.requests == 0
