"""The SSD cache under the loader: hits, zero GETs, damage, eviction, processes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import asyncloader as al
from asyncloader._cache import ObjectCache, parse_size
from asyncloader.testing import MotoServer, S3TestServer

from .conftest import N_IMAGES


def _loader(server: S3TestServer | MotoServer, cache_dir: Path, **kw: object) -> al.ImageLoader:
    kw.setdefault("batch_size", 16)
    kw.setdefault("decode_workers", 2)
    kw.setdefault("decode_backend", "thread")  # spawning decode processes is not the subject
    url = "s3://b/train/" if isinstance(server, S3TestServer) else "s3://data/train/"
    return al.ImageLoader(
        url,
        cache_dir=cache_dir,
        store_options={"endpoint_url": server.endpoint},
        **kw,  # type: ignore[arg-type]
    )


def _epoch(loader: al.ImageLoader, epoch: int) -> tuple[list[int], np.ndarray]:
    loader.set_epoch(epoch)
    labels, pixels = [], []
    for images, lab in loader:
        labels += lab.tolist()
        pixels.append(images.numpy().copy())
    return labels, np.concatenate(pixels)


def test_second_epoch_is_served_from_disk(light_server: S3TestServer, tmp_path: Path) -> None:
    with _loader(light_server, tmp_path / "c", shuffle=False, prefetch_batches=2) as loader:
        _, first = _epoch(loader, 0)
        gets_after_first = light_server.stats()["counters"]["get"]
        _, again = _epoch(loader, 0)  # same epoch: same pixels, from the cache
        stats = loader.stats()
    assert light_server.stats()["counters"]["get"] == gets_after_first  # zero GETs
    assert np.array_equal(first, again)
    assert stats.cache_hits >= N_IMAGES
    assert stats.bytes_from_cache > 0
    assert stats.cache_stored == N_IMAGES
    assert "hits" in stats.summary()


def test_later_run_uses_the_cache_and_matches_uncached_pixels(
    moto: MotoServer, moto_dataset: str, tmp_path: Path
) -> None:
    with _loader(moto, tmp_path / "c", seed=3, decode_backend="thread") as loader:
        labels_cold, cold = _epoch(loader, 5)
    with _loader(moto, tmp_path / "c", seed=3, decode_backend="auto") as loader:
        assert loader.decode_backend == "process"  # "auto" with a cache
        labels_warm, warm = _epoch(loader, 5)
        stats = loader.stats()
    assert labels_cold == labels_warm
    assert np.array_equal(cold, warm)
    assert stats.cache_hits >= N_IMAGES
    assert stats.requests == 0  # the whole run came from disk, in worker processes
    with al.ImageLoader(
        moto_dataset, batch_size=16, seed=3, store_options={"endpoint_url": moto.endpoint}
    ) as loader:
        assert loader.decode_backend == "thread"  # "auto" without a cache
        _, uncached = _epoch(loader, 5)
    assert np.array_equal(uncached, warm)


def test_damaged_entry_is_dropped_and_refetched(light_server: S3TestServer, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    with _loader(light_server, cache_dir, shuffle=False, prefetch_batches=2) as loader:
        _, first = _epoch(loader, 0)
    files = sorted(cache_dir.rglob("*.val"))
    assert len(files) == N_IMAGES  # JPEG-sized values are stored as files
    for victim in files[:3]:
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    files[3].write_bytes(files[3].read_bytes()[:100])  # truncated on disk
    light_server.reset_stats()
    with _loader(light_server, cache_dir, shuffle=False, prefetch_batches=2) as loader:
        _, again = _epoch(loader, 0)
        stats = loader.stats()
    assert np.array_equal(first, again)  # never decoded from damaged bytes
    assert stats.cache_damaged == 4
    assert light_server.stats()["counters"]["get"] == 4  # exactly the damaged ones refetched
    assert ObjectCache(cache_dir).verify() == (N_IMAGES, 0)


def test_eviction_keeps_the_cache_under_its_limit(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "c"
    limit = 2_000_000  # a fifth of the dataset
    with _loader(light_server, cache_dir, cache_size=limit) as loader:
        for epoch in range(2):
            labels, _ = _epoch(loader, epoch)
            assert len(labels) == N_IMAGES
    stats = ObjectCache(cache_dir, size_limit=limit).stats()
    assert stats.volume <= limit * 1.2  # diskcache culls a few entries per write
    assert 0 < stats.entries < N_IMAGES
    on_disk = sum(p.stat().st_size for p in cache_dir.rglob("*.val"))
    assert on_disk <= limit * 1.2


def test_parse_size() -> None:
    assert parse_size("500GB") == 500 * 10**9
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size(" 1.5 mb ") == 1_500_000
    assert parse_size(123) == 123
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_node_local_shuffle_keeps_each_node_cache_to_its_share(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """Two nodes of one rank each, each with its own cache: over three epochs every node
    only ever fetches (and caches) its stable half, and each epoch still covers everything."""
    seen: dict[int, list[set[int]]] = {}
    for node in (0, 1):
        with _loader(
            light_server,
            tmp_path / f"node{node}",
            shuffle="node",
            rank=node,
            world_size=2,
            local_world_size=1,
            labels=lambda key: int(key.split("/")[-1].split(".")[0].split("_")[-1]),
        ) as loader:
            seen[node] = [set(_epoch(loader, e)[0]) for e in range(3)]
        entries = sum(1 for _ in ObjectCache(tmp_path / f"node{node}").entry_keys())
        assert entries == N_IMAGES // 2  # this node's half, nothing more
    for e in range(3):
        assert seen[0][e] | seen[1][e] == set(range(N_IMAGES))  # the epoch, exactly
        assert not seen[0][e] & seen[1][e]
    assert seen[0][0] == seen[0][1] == seen[0][2]  # the same subset every epoch


def test_warm_for_node_local_covers_exactly_what_the_node_reads(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    opts = {"endpoint_url": light_server.endpoint}
    report = al.warm("s3://b/train/", tmp_path / "c", shard=(1, 2), node_seed=9, store_options=opts)
    assert report.listed == N_IMAGES // 2 and not report.failed
    with _loader(
        light_server,
        tmp_path / "c",
        shuffle="node",
        seed=9,
        rank=1,
        world_size=2,
        local_world_size=1,
    ) as loader:
        for epoch in range(2):
            _epoch(loader, epoch)
        assert loader.stats().requests == 0  # everything this node reads was warmed


def test_value_folder_removed_by_another_process_is_made_again(tmp_path: Path) -> None:
    """The cache remembers the value folders it made; one removed meanwhile (another process
    cleared the cache) is made again rather than failing the write."""
    from asyncloader._cache import _disk_class

    disk = _disk_class()(str(tmp_path))
    target = tmp_path / "ab" / "cd" / "one.val"
    assert disk._write(str(target), iter([b"x" * 10]), "xb") == 10
    shutil.rmtree(tmp_path / "ab")
    assert disk._write(str(target), iter([b"y" * 5]), "xb") == 5
    assert target.read_bytes() == b"yyyyy"


def test_entries_of_the_older_value_layout_are_still_read(tmp_path: Path) -> None:
    """Value files used to sit two folder levels deep; rows keep each file's name, so a cache
    written that way is read, verified and cleared by the one-level layout."""
    import zlib

    import diskcache

    old = diskcache.Cache(str(tmp_path / "objects"), disk_min_file_size=32 * 1024)
    value = bytes(range(256)) * 400  # a newline every 256 bytes, like a JPEG
    old.set("old", value, tag=zlib.crc32(value))
    old.close()
    cache = ObjectCache(tmp_path)
    cache.put("new", value)
    where = cache.locate(["old", "new"])
    old_at, new_at = where["old"], where["new"]
    assert old_at is not None and new_at is not None
    assert old_at.filename.count(os.sep) == 2 and new_at.filename.count(os.sep) == 1
    assert cache.read("old", len(value), old_at) == value
    assert cache.get("new", len(value)) == value
    assert cache.verify() == (2, 0)
    assert cache.clear() == 2
    assert list((tmp_path / "objects").rglob("*.val")) == []
