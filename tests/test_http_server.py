"""Python's own ``http.server`` (``python -m http.server``), a server nobody here wrote:
HTTP/1.0 answers, a connection per request, a listen queue of five, no ETags; and a caption
folder on it, its objects named by its own metadata file (no manifest)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncloader as al
from asyncloader.testing import PythonHTTPServer

from ._captions import caption_folder


def _pixels(
    url: str, manifest: Path, cache: Path | None = None
) -> tuple[np.ndarray, np.ndarray, al.Stats]:
    """One epoch; with ``cache``, the next epoch, prefetched while this one ends, reads the
    node's cache, not the server."""
    with al.ImageLoader(
        url,
        labels=str(manifest),
        batch_size=16,
        transform=al.Resize(24),
        shuffle=False,
        # 128 requests in flight at once, none sent twice (the subject is connections).
        fetch=al.FetchConfig(max_inflight=128, adaptive=False, hedge=False),
        engine=al.EngineConfig(mode="inline"),
        cache_dir=cache,
    ) as loader:
        pairs = [(images.numpy().copy(), labels.numpy().copy()) for images, labels in loader]
        stats = loader.stats()
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs]), stats


def test_a_folder_from_python_http_server_streams_every_image_once(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """Each image by one GET on a connection of its own, 128 wanted at once: the client
    never reuses a connection the server closed and never overflows its listen queue into
    read timeouts (no retry at all), and the pixels are the folder's."""
    files = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    rows = [  # sizes given: GETs alone (HEADs against servers as they are: test_nginx.py)
        {"key": k, "label": i, "size": (jpeg_folder / k).stat().st_size}
        for i, k in enumerate(files)
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    want, want_labels, _ = _pixels(str(jpeg_folder), manifest)
    with PythonHTTPServer(jpeg_folder) as server:
        got, labels, stats = _pixels(server.endpoint + "/", manifest, tmp_path / "cache")
        requests = server.requests()
    assert np.array_equal(labels, want_labels) and np.array_equal(got, want)
    assert stats.retries == {} and stats.skipped == {}
    gets = Counter(path for method, path, status in requests if method == "GET" and status == 200)
    assert gets == Counter({"/" + k: 1 for k in files})
    assert all(status == 200 for _, _, status in requests)


def _bucketed(url: str, cache: Path | None = None) -> tuple[list[Any], al.Stats]:
    with al.ImageLoader(
        url,
        batch_size=2,
        labels=None,
        buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
        filters=[("score", ">=", 1)],
        extras=("text", "original_size"),
        seed=3,
        engine=al.EngineConfig(mode="inline"),
        cache_dir=cache,
    ) as loader:
        got = [(x.numpy().copy(), e["text"], e["original_size"]) for x, _, e in loader]
        return got, loader.stats()


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_a_caption_folder_streams_named_by_its_metadata_file(tmp_path: Path, kind: str) -> None:
    """No manifest: the folder's metadata file names its images (a web server has no
    listing). Bucketed, filtered batches with their captions, the same as from the folder
    on disk; an image the filter leaves out is never fetched."""
    if kind == "parquet":
        pytest.importorskip("pyarrow", reason="pip install 'asyncloader[parquet]'")
    folder = caption_folder(tmp_path / "site", kind)
    want, _ = _bucketed(str(folder))
    with PythonHTTPServer(folder) as server:
        got, stats = _bucketed(server.endpoint + "/", tmp_path / "cache")
        requests = server.requests()
    assert len(got) == len(want) > 0
    for (x, text, size), (wx, wtext, wsize) in zip(got, want, strict=True):
        assert text == wtext and size == wsize and np.array_equal(x, wx)
    kept = {f"photo {i}" for i in range(12) if i % 3 >= 1}
    assert {t for _, texts, _ in got for t in texts} <= kept
    assert stats.filtered_out == 4
    # Filtered-out images: named by the metadata file, so sized (one HEAD each, when
    # listing), never fetched.
    gets = Counter(path for method, path, _ in requests if method == "GET")
    for i in range(12):
        name = f"/sub/{i:02d}.jpg" if i % 4 == 0 else f"/{i:02d}.jpg"
        assert (gets[name] > 0) == (i % 3 >= 1), name
    assert gets[f"/metadata.{kind}"] >= 1


def test_a_web_folder_without_a_manifest_or_metadata_file_says_what_names_its_objects(
    jpeg_folder: Path,
) -> None:
    with (
        PythonHTTPServer(jpeg_folder) as server,
        pytest.raises(al.StoreError, match=r"no metadata.jsonl, metadata.csv, metadata.parquet"),
        al.ImageLoader(server.endpoint + "/", batch_size=4) as loader,
    ):
        next(iter(loader))


def test_a_caption_folder_from_a_server_without_etags_runs_offline_from_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``http.server`` sends no ETag, so the metadata file cannot be checked by one: while
    the server answers it is fetched each run; once it does not, the copy the node kept
    when it last answered (of the listed size) serves, with a warning that says so."""
    folder = caption_folder(tmp_path / "site")
    cache = tmp_path / "cache"
    with PythonHTTPServer(folder) as server:
        url = server.endpoint + "/"
        report = al.warm(url, str(cache))
        assert report.warmed == report.listed == 12 and not report.failed
        online, _ = _bucketed(url, cache)
    with caplog.at_level(logging.WARNING, logger="asyncloader"):
        offline, stats = _bucketed(url, cache)  # nothing answers there now
    assert [(t, s) for _, t, s in offline] == [(t, s) for _, t, s in online]
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(offline, online, strict=True))
    assert "the copy of its metadata file kept on this node" in caplog.text
    assert stats.requests == 0
