"""Captions offline: the root's metadata file, and those of its folders, are kept on the
node's disk beside the saved listing (with their ETags), warmed by ``warm``, counted in
``stats()``; a run with a warm cache
starts and finishes with the store unreachable, captions and filters included; a metadata
file replaced in the store is fetched again once the listing says so."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import asyncloader as al
from asyncloader._base._stats import Counters
from asyncloader._dataset import metadata_file
from asyncloader._stores import open_store
from asyncloader.testing import FaultProxy, MotoServer

N = 12


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30 + 4 * i), (20 * i, 100, 50)).save(buf, "JPEG")
    return buf.getvalue()


def _rows(tag: str) -> bytes:
    rows = [{"file_name": f"{i:02d}.jpg", "idx": i, "caption": f"{tag} {i}"} for i in range(N)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _captions(url: str, endpoint: str, folder: Path, **kw: Any) -> tuple[dict[int, str], al.Stats]:
    with al.ImageLoader(
        url,
        batch_size=4,
        labels="idx",
        extras=("caption",),
        cache_dir=str(folder),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
        **kw,
    ) as loader:
        got = {
            i: c
            for _, labels, extras in loader  # type: ignore[misc]
            for i, c in zip(labels.tolist(), extras["caption"], strict=True)
        }
        return got, loader.stats()


def test_a_warm_cache_runs_captions_with_the_store_stopped(
    moto: MotoServer, tmp_path: Path
) -> None:
    bucket = "offline"
    moto.create_bucket(bucket)
    for i in range(N):
        moto.put(bucket, f"set/{i:02d}.jpg", _jpeg(i))
    moto.put(bucket, "set/metadata.jsonl", _rows("first"))
    url, cache = f"s3://{bucket}/set/", tmp_path / "cache"
    with FaultProxy(moto.endpoint) as proxy:
        report = al.warm(url, cache, store_options={"endpoint_url": proxy.endpoint})
        assert report.failed == [] and report.warmed == N
        assert proxy.targets[f"GET /{bucket}/set/metadata.jsonl"] == 1
        endpoint = proxy.endpoint
    # The store is gone: the listing, the metadata file and the images come from the disk.
    got, stats = _captions(url, endpoint, cache, filters=[("idx", "<", 8)])
    assert got == {i: f"first {i}" for i in range(8)}
    assert stats.requests == 0 and stats.bytes_from_cache > 0
    assert stats.filtered_out == N - 8

    # Back online, with the metadata file replaced: a run on the saved listing reads the
    # copy without a request; a fresh listing sees the new ETag and fetches it once.
    moto.put(bucket, "set/metadata.jsonl", _rows("second"))
    with FaultProxy(moto.endpoint) as proxy:
        got, stats = _captions(url, proxy.endpoint, cache)
        assert got == {i: f"first {i}" for i in range(N)}
        assert stats.requests == 0 and proxy.requests == 0
        fresh = al.CacheConfig(refresh_listing=True)
        got, stats = _captions(url, proxy.endpoint, cache, cache=fresh)
        assert got == {i: f"second {i}" for i in range(N)}
        assert proxy.targets[f"GET /{bucket}/set/metadata.jsonl"] == 1
        assert stats.requests == 1  # the metadata file: the images are cached
        got, _ = _captions(url, proxy.endpoint, cache)
        assert got == {i: f"second {i}" for i in range(N)}
        assert proxy.targets[f"GET /{bucket}/set/metadata.jsonl"] == 1


def test_metadata_files_in_folders_are_warmed_and_read_offline(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A dataset kept in folders, each with its own metadata file (naming its images
    relative to itself; a JSONL and a CSV), and the root's: every file is fetched once by
    ``warm``, and a run with the store gone gives each image its own row's caption, its
    filter deciding on a column that one file alone has."""
    bucket = "offline-folders"
    moto.create_bucket(bucket)
    where = {i: ("", "part-1/", "part-2/")[i % 3] for i in range(N)}
    for i in range(N):
        moto.put(bucket, f"set/{where[i]}{i:02d}.jpg", _jpeg(i))
    root = [{"file_name": f"{i:02d}.jpg", "idx": i, "caption": f"root {i}"} for i in range(N)]
    moto.put(
        bucket,
        "set/metadata.jsonl",
        "".join(json.dumps(r) + "\n" for r in root if where[r["idx"]] == "").encode(),
    )
    one = [
        {"file_name": f"{i:02d}.jpg", "idx": i, "caption": f"one {i}", "score": i}
        for i in range(N)
        if where[i] == "part-1/"
    ]
    moto.put(
        bucket, "set/part-1/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in one).encode()
    )
    two = "file_name,idx,caption\n" + "".join(
        f"{i:02d}.jpg,{i},two {i}\n" for i in range(N) if where[i] == "part-2/"
    )
    moto.put(bucket, "set/part-2/metadata.csv", two.encode())
    url, cache = f"s3://{bucket}/set/", tmp_path / "cache"
    with FaultProxy(moto.endpoint) as proxy:
        report = al.warm(url, cache, store_options={"endpoint_url": proxy.endpoint})
        assert report.failed == [] and report.warmed == N
        for name in ("metadata.jsonl", "part-1/metadata.jsonl", "part-2/metadata.csv"):
            assert proxy.targets[f"GET /{bucket}/set/{name}"] == 1, name
        endpoint = proxy.endpoint
    # The store is gone.
    tag = {"": "root", "part-1/": "one", "part-2/": "two"}
    got, stats = _captions(url, endpoint, cache)
    assert got == {i: f"{tag[where[i]]} {i}" for i in range(N)}
    assert stats.requests == 0
    # Only part-1's file has a score: the rows of the others have none, so fail it.
    got, stats = _captions(url, endpoint, cache, filters=[("score", ">=", 4)])
    assert got == {i: f"one {i}" for i in range(N) if where[i] == "part-1/" and i >= 4}
    assert stats.filtered_out == N - len(got) and stats.requests == 0


def test_sidecars_are_warmed_with_their_images_and_read_offline(
    moto: MotoServer, tmp_path: Path
) -> None:
    """img2dataset's "files" layout: ``x.txt`` and ``x.json`` beside ``x.jpg``.  ``warm``
    fetches each image's sidecars with it (once each, counted apart), not other files; a
    run with the store gone gives every sample its caption and its JSON."""
    bucket = "offline-sidecars"
    moto.create_bucket(bucket)
    for i in range(N):
        moto.put(bucket, f"set/{i:02d}.jpg", _jpeg(i))
        if i % 3:
            moto.put(bucket, f"set/{i:02d}.txt", f"caption {i}".encode())
        moto.put(bucket, f"set/{i:02d}.json", json.dumps({"idx": i}).encode())
    moto.put(bucket, "set/notes.txt", b"not a sidecar: no image of that name")
    url, cache = f"s3://{bucket}/set/", tmp_path / "cache"
    sidecars = N + sum(1 for i in range(N) if i % 3)
    with FaultProxy(moto.endpoint) as proxy:
        report = al.warm(url, cache, store_options={"endpoint_url": proxy.endpoint})
        assert report.failed == [] and report.sidecars == sidecars
        assert report.warmed == report.listed == N + sidecars
        assert proxy.targets[f"GET /{bucket}/set/01.txt"] == 1
        assert proxy.targets[f"GET /{bucket}/set/00.json"] == 1
        assert proxy.targets[f"GET /{bucket}/set/notes.txt"] == 0
        endpoint = proxy.endpoint
    # The store is gone.
    with al.ImageLoader(
        url,
        batch_size=4,
        labels=None,
        extras=("txt", "json"),
        cache_dir=str(cache),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        got = {
            j["idx"]: t for _, _, extras in loader for t, j in zip(*extras.values(), strict=True)
        }
        stats = loader.stats()
    assert got == {i: (f"caption {i}" if i % 3 else None) for i in range(N)}
    # Every sidecar from the node's cache: this epoch's, and those of the next epoch's
    # batches the loader prefetched meanwhile (as many as it got to: timing's).
    assert stats.requests == 0 and stats.sidecars_cached >= sidecars


def _with_a_gap(moto: MotoServer, bucket: str) -> str:
    """A folder of N photos but the sixth (05.jpg), which its metadata file names: its URL."""
    moto.create_bucket(bucket)
    for i in range(N):
        if i != 5:
            moto.put(bucket, f"set/{i:02d}.jpg", _jpeg(i))
    moto.put(bucket, "set/metadata.jsonl", _rows("one"))
    return f"s3://{bucket}/set/"


def test_a_name_the_listing_lacks_is_missing_without_a_request_online_or_offline(
    moto: MotoServer, tmp_path: Path
) -> None:
    """The metadata file names an image the bucket does not have: the listing says so, so
    the image is reported missing as it is read (a counted ``ObjectNotFound`` skip under
    ``on_error="skip"``) without asking the store for it: online no GET for it, and with
    the store stopped the same skip at once, not a store that does not answer (a
    ``TransientStoreError`` after its retries)."""
    bucket = "offline-gap"
    url, cache = _with_a_gap(moto, bucket), tmp_path / "cache"
    skip = al.ErrorConfig(on_error="skip", max_failures=1)
    with FaultProxy(moto.endpoint) as proxy:
        report = al.warm(url, cache, store_options={"endpoint_url": proxy.endpoint})
        assert report.warmed == N - 1 and report.failed == []  # warm reads what is listed
        assert report.missing == ["05.jpg"]  # and says what the file names that is not
        got, stats = _captions(url, proxy.endpoint, cache, errors=skip)
        endpoint = proxy.endpoint
        assert not [t for t in proxy.targets if t.endswith("/05.jpg")]
    assert got == {i: f"one {i}" for i in range(N) if i != 5}
    assert stats.skipped == {"ObjectNotFound": 1} and stats.skipped_keys == ("05.jpg",)
    assert stats.requests == 0  # the rest came from the warm cache
    got, stats = _captions(url, endpoint, cache, errors=skip)  # the store is gone
    assert got == {i: f"one {i}" for i in range(N) if i != 5}
    assert stats.skipped == {"ObjectNotFound": 1} and stats.retries == {}


def test_a_bucketed_run_finds_a_name_the_listing_lacks_missing_without_a_request(
    moto: MotoServer, tmp_path: Path
) -> None:
    """The same gap under aspect-ratio buckets, whose header pass reads each image's size
    before the first batch: the missing image's header is not asked for either, so online
    the store sees no request for it, and with the store stopped the run starts from the
    warm cache (not a store that does not answer, after its retries) — under ``"skip"``
    the image is the counted ``ObjectNotFound`` skip, under ``"raise"`` the run stops at
    its start naming it, online and offline alike."""
    bucket = "offline-gap-buckets"
    url, cache = _with_a_gap(moto, bucket), tmp_path / "cache"
    skip = al.ErrorConfig(on_error="skip", max_failures=1)
    buckets = al.Buckets(((16, 16), (20, 16)))
    with FaultProxy(moto.endpoint) as proxy:
        report = al.warm(url, cache, store_options={"endpoint_url": proxy.endpoint})
        assert report.missing == ["05.jpg"]
        got, stats = _captions(url, proxy.endpoint, cache, errors=skip, buckets=buckets)
        with pytest.raises(al.ObjectNotFound, match=r"05\.jpg"):
            _captions(url, proxy.endpoint, cache, buckets=buckets)
        endpoint = proxy.endpoint
        assert not [t for t in proxy.targets if t.endswith("/05.jpg")]
    # Two buckets of batches of 4: each leaves fewer than a batch over.
    assert set(got) <= {i for i in range(N) if i != 5} and len(got) >= N - 1 - 2 * 3
    assert stats.skipped == {"ObjectNotFound": 1} and stats.requests == 0
    online = got
    got, stats = _captions(url, endpoint, cache, errors=skip, buckets=buckets)  # store gone
    assert got == online
    assert stats.skipped == {"ObjectNotFound": 1} and stats.retries == {}
    with pytest.raises(al.ObjectNotFound, match=r"05\.jpg"):
        _captions(url, endpoint, cache, buckets=buckets)


def test_the_metadata_file_is_counted_kept_and_checked_against_its_etag(
    moto: MotoServer, tmp_path: Path
) -> None:
    """Fetched: a request and its bytes; kept: the bytes read from the disk, no request; a
    listing with another ETag fetches again; without a folder every read is a request; a
    file replaced since the listing fails its ETag check, never mixed."""
    bucket = "offline-count"
    moto.create_bucket(bucket)
    moto.put(bucket, "set/metadata.jsonl", _rows("one"))

    async def main() -> None:
        store = open_store(f"s3://{bucket}/set/", endpoint_url=moto.endpoint)
        try:
            info = await store.stat("metadata.jsonl")
            for folder, fetched in ((str(tmp_path), 1), (str(tmp_path), 0), (None, 1)):
                c = Counters()
                assert await metadata_file(store, folder, info, c) == _rows("one")
                assert (c.requests, c.bytes_fetched) == (fetched, fetched * info.size)
                assert c.bytes_from_cache == (1 - fetched) * info.size
            moto.put(bucket, "set/metadata.jsonl", _rows("two!"))
            assert await metadata_file(store, str(tmp_path), info) == _rows("one")  # kept
            with pytest.raises(al.StoreError):  # not kept: the ETag check
                await metadata_file(store, None, info)
            new = await store.stat("metadata.jsonl")
            c = Counters()
            assert await metadata_file(store, str(tmp_path), new, c) == _rows("two!")
            assert c.requests == 1
        finally:
            await store.close()

    asyncio.run(main())


def test_a_metadata_file_listed_without_a_version_serves_from_its_kept_copy_when_offline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that gives a file neither an ETag nor a ``Last-Modified`` lists it without
    a version: nothing can check the node's copy, so it is fetched whenever the store
    answers (and kept); once the store does not answer (each try, retried as any read is,
    fails), the copy the node kept, of the listed size, serves, with a warning that says
    so; a copy of another size does not."""
    from asyncloader._base._errors import TransientStoreError
    from asyncloader._base._types import ObjectInfo
    from asyncloader._stores._retry import CONTROL_RETRIES
    from asyncloader.testing import MemoryStore

    class Gone(MemoryStore):
        async def get(self, key: str, **kw: Any) -> bytes:  # type: ignore[override]
            self.requests["get"] += 1
            raise TransientStoreError(f"{self.url}{key}: the server does not answer", key=key)

    data = _rows("one")
    listed = ObjectInfo("metadata.jsonl", len(data), "")  # no version
    folder = str(tmp_path)

    async def main() -> None:
        online = MemoryStore({"metadata.jsonl": data}, name="plain")
        for _ in range(2):  # fetched each time the store answers
            c = Counters()
            assert await metadata_file(online, folder, listed, c) == data
            assert (c.requests, c.bytes_fetched) == (1, len(data))
        gone = Gone(name="plain")
        c = Counters()
        with caplog.at_level("WARNING", logger="asyncloader"):
            assert await metadata_file(gone, folder, listed, c) == data
        assert "the copy of its metadata file kept on this node" in caplog.text
        assert gone.requests["get"] == CONTROL_RETRIES.max_attempts
        assert (c.bytes_fetched, c.bytes_from_cache) == (0, len(data))
        other = ObjectInfo("metadata.jsonl", len(data) + 1, "")
        with pytest.raises(TransientStoreError):
            await metadata_file(gone, folder, other, Counters())

    asyncio.run(main())


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
