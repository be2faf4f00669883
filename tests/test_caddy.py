"""Caddy, a third web server nobody here wrote (``file_server browse``): its folder pages
answer a request that accepts JSON with a list of the folder's files and their exact sizes,
which the loader asks for, so a class folder is listed with no HEAD at all; a caption
folder's metadata file and headers are read as from any server.  Subprocesses on
127.0.0.1, started and stopped by the tests."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from asyncloader.testing import Caddy, find_caddy

from ._captions import WIDE, caption_folder, class_captions, class_cut, class_epoch, wide_epoch

pytestmark = pytest.mark.skipif(
    find_caddy() is None and not os.environ.get("ASYNCLOADER_REQUIRE_CADDY"),
    reason="caddy is not installed (apt-get install caddy; .ci/run installs it)",
)


def test_a_class_folder_listed_by_caddy_s_json_pages(jpeg_folder: Path, tmp_path: Path) -> None:
    """No manifest, no metadata file: the loader asks Caddy's folder pages for JSON, whose
    entries give each file's exact size, so no image is HEAD-asked; a filter on ``size``
    keeps the smaller half, and an image it leaves out is never asked at all.  Caddy
    stopped, the same run comes from the node's cache."""
    site = tmp_path / "site"
    sizes, cut, kept = class_cut(site, jpeg_folder)
    cache = tmp_path / "cache"
    with Caddy(site) as server:
        got, classes, stats = class_epoch(f"{server.endpoint}/", cut, cache)
        answers = server.answers()
    assert classes == ("cat", "dog")
    assert got == class_captions(kept) and stats.filtered_out == len(sizes) - len(kept)
    pages = Counter(a.path for a in answers if a.path.endswith("/"))
    assert pages == {"/": 1, "/cat/": 1, "/dog/": 1}
    for key in sizes:
        asked = {a.method for a in answers if a.path == f"/{key}"}
        assert asked == ({"GET"} if key in kept else set()), (key, asked)
    again, _, stats = class_epoch(f"{server.endpoint}/", cut, cache)  # Caddy stopped
    assert again == got and stats.requests == 0


def test_a_bucketed_caption_folder_from_caddy(tmp_path: Path) -> None:
    """A caption folder in aspect-ratio buckets from Caddy, filtered on the width its
    headers give: the metadata file read once, each image sized by a HEAD and read once, by
    the range read of its header; every batch one bucket's shape."""
    with Caddy(caption_folder(tmp_path / "site")) as server:
        got, stats = wide_epoch(f"{server.endpoint}/", tmp_path / "cache")
        answers = server.answers()
    assert got == WIDE and stats.filtered_out == 12 - len(WIDE)
    assert [(a.method, a.path) for a in answers if "metadata" in a.path] == [
        ("GET", "/metadata.jsonl")
    ]
    per_image = Counter((a.path, a.method) for a in answers if a.path.endswith(".jpg"))
    assert len(per_image) == 24 and set(per_image.values()) == {1}, per_image
