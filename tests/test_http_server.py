"""Python's own ``http.server`` (``python -m http.server``), a server nobody here wrote:
HTTP/1.0 answers, a connection per request, a listen queue of five, no ETags; a caption
folder on it, its objects named by its own metadata file (no manifest); and a plain class
folder, listed by the server's own folder pages."""

from __future__ import annotations

import asyncio
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
from .conftest import listed_keys


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
    # Filtered-out images: named by the metadata file, never asked for (no HEAD, no GET).
    asked = Counter(path for _, path, _ in requests)
    gets = Counter(path for method, path, _ in requests if method == "GET")
    for i in range(12):
        name = f"/sub/{i:02d}.jpg" if i % 4 == 0 else f"/{i:02d}.jpg"
        assert (asked[name] > 0) == (gets[name] > 0) == (i % 3 >= 1), (name, requests)
    assert gets[f"/metadata.{kind}"] >= 1


def _folder_epoch(
    url: str, cache: Path
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], al.Stats]:
    """One epoch of a class folder, labelled by its folders, in key order."""
    with al.ImageLoader(
        url,
        batch_size=16,
        transform=al.Resize(24),
        shuffle=False,
        engine=al.EngineConfig(mode="inline"),
        cache_dir=cache,
        # GETs are counted at the server: no hedge (a second request of the same fetch,
        # sent when one is slow, as one is on a loaded machine).
        fetch=al.FetchConfig(hedge=False),
    ) as loader:
        pairs = [(images.numpy().copy(), labels.numpy().copy()) for images, labels in loader]
        classes, stats = loader.classes, loader.stats()
    images = np.concatenate([p[0] for p in pairs])
    return images, np.concatenate([p[1] for p in pairs]), classes, stats


def test_a_plain_folder_is_listed_by_its_folder_pages(jpeg_folder: Path, tmp_path: Path) -> None:
    """No manifest and no metadata file: ``http.server``'s folder pages list the class
    folders and the images in them, as ``fsspec`` reads a web folder.  The samples, their
    labels and pixels are the local folder's; each folder page is asked once, each image
    HEAD-asked once (the pages give no sizes) and fetched once; the next run reads the
    saved listing and the node's cache with the server stopped."""
    want, want_labels, want_classes, _ = _folder_epoch(str(jpeg_folder), tmp_path / "local")
    cache = tmp_path / "cache"
    with PythonHTTPServer(jpeg_folder) as server:
        url = server.endpoint + "/"
        got, labels, classes, stats = _folder_epoch(url, cache)
        requests = server.requests()
    assert classes == want_classes and len(classes) > 1
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(got, want)
    pages = Counter(path for method, path, _ in requests if path.endswith("/"))
    assert set(pages) == {"/", *(f"/{c}/" for c in classes)} and set(pages.values()) == {1}
    files = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    for method in ("HEAD", "GET"):
        asked = Counter(path for m, path, _ in requests if m == method and path.endswith(".jpg"))
        assert asked == {f"/{k}": 1 for k in files}, (method, stats.hedges_sent, stats.retries)
    again, again_labels, _, stats = _folder_epoch(url, cache)  # nothing answers there now
    np.testing.assert_array_equal(again, want)
    np.testing.assert_array_equal(again_labels, want_labels)
    assert stats.requests == 0


def test_a_web_folder_without_a_manifest_metadata_file_or_folder_page_says_what_names_its_objects(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """A folder served with an ``index.html`` of its own (no links below it) is no listing:
    the error says what would name its objects."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text('<html><a href="/">home</a> <a href="../">up</a></html>')
    (site / "0.jpg").write_bytes(sorted(jpeg_folder.rglob("*.jpg"))[0].read_bytes())
    with (
        PythonHTTPServer(site) as server,
        pytest.raises(al.StoreError, match=r"no metadata.jsonl, .*and no folder page of links"),
        al.ImageLoader(server.endpoint + "/", batch_size=4) as loader,
    ):
        next(iter(loader))


def test_an_extensionless_link_is_asked_as_a_folder_once_then_listed_as_a_file(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """A link with neither a slash nor an extension may be a folder whose link lacks its
    slash (express's serve-index): asked for at the link and a ``/`` — ``http.server``
    answers 404 for a file there — it is listed as the file it is, and never fetched by
    the listing."""
    site = tmp_path / "site"
    (site / "cat").mkdir(parents=True)
    (site / "cat" / "0.jpg").write_bytes(sorted(jpeg_folder.rglob("*.jpg"))[0].read_bytes())
    (site / "LICENSE").write_text("CC-BY-4.0")
    with PythonHTTPServer(site) as server:
        assert listed_keys(server.endpoint + "/") == ["LICENSE", "cat/0.jpg"]
        asked = [(m, path, status) for m, path, status in server.requests() if "LICENSE" in path]
    assert asked[0] == ("GET", "/LICENSE/", 404)
    assert [a for a in asked if a[0] == "GET" and a[1] == "/LICENSE"] == []


def test_folder_pages_that_link_into_themselves_are_an_error_not_a_walk_without_end(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """A symlink to a parent folder, served as a folder: its pages go down for ever.  The
    walk stops at its depth bound with an error that says why."""
    site = tmp_path / "site"
    (site / "a").mkdir(parents=True)
    (site / "a" / "0.jpg").write_bytes(sorted(jpeg_folder.rglob("*.jpg"))[0].read_bytes())
    (site / "a" / "up").symlink_to("..", target_is_directory=True)
    with PythonHTTPServer(site) as server:
        with pytest.raises(al.StoreError, match=r"folders deep .* links into itself"):
            listed_keys(server.endpoint + "/")
        pages = [path for _, path, _ in server.requests() if path.endswith("/")]
    assert len(pages) == len(set(pages)) <= 40  # each page once, and the walk ended


def test_a_caption_folder_from_a_server_without_etags_runs_offline_from_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``http.server`` sends no ETag: its objects are versioned by their ``Last-Modified``,
    the metadata file too, so the copy of it the node kept is known to be the listed one:
    with the server gone, the run asks nothing of it (no try, no warning) and delivers
    what it did online."""
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
    assert "metadata file kept on this node" not in caplog.text
    assert stats.requests == stats.bytes_fetched == 0


def test_warm_of_a_caption_folder_fails_the_image_the_server_lacks_without_asking_again(
    tmp_path: Path,
) -> None:
    """The folder is listed from its metadata file, and a name the server does not have is
    listed as not there (its HEAD's 404): ``warm`` does not ask for it again, and reports it
    as an object of the listing that could not be warmed (status 1 on the command line)."""
    folder = caption_folder(tmp_path / "site")
    (folder / "07.jpg").unlink()
    with PythonHTTPServer(folder) as server:
        report = al.warm(server.endpoint + "/", str(tmp_path / "cache"))
        asked = server.requests()
    assert [key for key, _ in report.failed] == ["07.jpg"] and report.missing == []
    assert "the store's listing has no such object" in report.failed[0][1]
    assert report.warmed == 11 and report.listed == 12
    assert [m for m, path, _ in asked if path == "/07.jpg"] == ["HEAD"]


def test_a_filter_on_size_sizes_only_what_the_rest_keeps_and_the_next_run_is_offline(
    tmp_path: Path,
) -> None:
    """A web folder's metadata file gives no sizes: the images the rest of the filter
    keeps are sized (a HEAD each) and then filtered on ``size``; those it leaves out are
    never asked for.  The listing kept on the node (its unasked sizes unknown) serves the
    next run with the server gone: the same samples, nothing tried (the metadata file's
    copy on the node is of its listed version, its ``Last-Modified``)."""
    folder = caption_folder(tmp_path / "site")
    rows = [json.loads(line) for line in (folder / "metadata.jsonl").read_text().splitlines()]
    size = {"/" + r["file_name"]: (folder / r["file_name"]).stat().st_size for r in rows}
    scored = sorted(size["/" + r["file_name"]] for r in rows if r["score"] >= 1)
    limit = scored[len(scored) // 2]  # half of those the score keeps, about
    filters = [("score", ">=", 1), ("size", ">=", limit)]

    def run(url: str, cache: Path | None = None) -> tuple[list[Any], al.Stats]:
        with al.ImageLoader(
            url,
            batch_size=2,
            labels=None,
            transform=al.Resize(16),
            filters=filters,
            extras=("text",),
            shuffle=False,
            engine=al.EngineConfig(mode="inline"),
            cache_dir=cache,
        ) as loader:
            got = [(x.numpy().copy(), t) for x, _, e in loader for t in [e["text"]]]
            return got, loader.stats()

    want, _ = run(str(folder))
    cache = tmp_path / "cache"
    with PythonHTTPServer(folder) as server:
        got, stats = run(server.endpoint + "/", cache)
        requests = server.requests()
    texts = sorted(t for _, ts in got for t in ts)
    kept = sorted(
        r["text"] for r in rows if r["score"] >= 1 and size["/" + r["file_name"]] >= limit
    )
    assert texts == kept and 0 < len(kept) < 8
    assert stats.filtered_out == 12 - len(kept)
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got, want, strict=True))
    heads = Counter(path for method, path, _ in requests if method == "HEAD")
    gets = Counter(path for method, path, _ in requests if method == "GET")
    for r in rows:
        name = "/" + r["file_name"]
        scored_in, sized_in = r["score"] >= 1, size[name] >= limit
        assert heads[name] == (1 if scored_in else 0), (name, requests)
        assert (gets[name] > 0) == (scored_in and sized_in), (name, requests)
    again, stats = run(server.endpoint + "/", cache)  # nothing answers there now
    assert stats.requests == stats.bytes_fetched == 0
    assert stats.filtered_out == 12 - len(kept)
    assert [t for _, t in again] == [t for _, t in got]
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(again, got, strict=True))


def test_a_web_folder_s_listing_asks_the_sizes_of_what_is_read_once_per_node(
    tmp_path: Path,
) -> None:
    """A loader lists a web folder without its images' sizes (the metadata file's are
    asked: it is read first); :func:`complete_sizes` asks those of the keys a run reads,
    saves them in the listing kept on the node (as listed at the same time), and a second
    process on the node finds them there, asking nothing.  Readers of the listing that do
    not ask sizes themselves (``warm``, ``ls``) list again, every object sized."""
    from asyncloader._base._types import UNSIZED
    from asyncloader._dataset import list_objects, saved_listing
    from asyncloader._dataset._listing import complete_sizes, list_and_save
    from asyncloader._dataset._saved import listing_path, load_listing_made
    from asyncloader._stores._web import HttpStore

    folder = caption_folder(tmp_path / "site")
    cache = str(tmp_path / "cache")
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*.*")}
    read = {"01.jpg", "sub/04.jpg"}

    async def main(url: str) -> None:
        store = HttpStore(url)
        try:
            listed = await list_and_save(store, cache, unsized=True)
            assert {o.key: o.size for o in listed} == {
                k: s if k == "metadata.jsonl" else UNSIZED for k, s in files.items()
            }
            asked = len(server.requests())
            path = listing_path(cache, store.url)
            made = load_listing_made(path, store.url)
            assert made is not None
            sized = await complete_sizes(store, cache, listed, read)
            assert sorted(r[:2] for r in server.requests()[asked:]) == [
                ("HEAD", "/01.jpg"),
                ("HEAD", "/sub/04.jpg"),
            ]
            want = {
                k: s if k in read or k == "metadata.jsonl" else UNSIZED for k, s in files.items()
            }
            assert {o.key: o.size for o in sized} == want
            kept = load_listing_made(path, store.url)
            assert kept is not None and list(kept[0]) == list(sized) and kept[1] == made[1]
            asked = len(server.requests())
            again = await complete_sizes(store, cache, listed, read)  # another process
            assert list(again) == list(sized) and len(server.requests()) == asked
            assert await saved_listing(store, cache, 3600) is None
            assert await saved_listing(store, cache, 3600, unsized=True) is not None
            everything = await list_objects(store, cache, 3600)
            assert {o.key: o.size for o in everything} == files
        finally:
            await store.close()

    with PythonHTTPServer(folder) as server:
        asyncio.run(main(server.endpoint + "/"))


def test_sizes_asked_of_a_store_without_a_listing_s_way_are_its_stat_s(tmp_path: Path) -> None:
    """Where a store has no ``stat_listed``, each key's ``stat``; an object it does not
    have is of size -1 (reported missing when read); keys not asked keep theirs."""
    from asyncloader._base._types import UNSIZED, ObjectInfo
    from asyncloader._dataset._listing import complete_sizes
    from asyncloader._dataset._objects import ObjectList
    from asyncloader._stores._local import LocalStore

    (tmp_path / "a.jpg").write_bytes(b"x" * 10)
    (tmp_path / "b.jpg").write_bytes(b"y" * 20)
    listed = ObjectList.of(
        [ObjectInfo("a.jpg", UNSIZED), ObjectInfo("b.jpg", UNSIZED), ObjectInfo("c.jpg", UNSIZED)]
    )
    store = LocalStore(tmp_path)
    got = asyncio.run(complete_sizes(store, None, listed, {"a.jpg", "c.jpg"}))
    assert [o.size for o in got] == [10, UNSIZED, -1]
    assert got[0].etag == asyncio.run(store.stat("a.jpg")).etag
