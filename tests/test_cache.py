"""The SSD cache under the loader: hits, zero GETs, damage, eviction, processes."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._base._types import ObjectInfo
from asyncloader._cache import IndexThread, ObjectCache, parse_size
from asyncloader._cache._admission import admission, admitted
from asyncloader.testing import MotoServer, S3TestServer

from .conftest import N_IMAGES


def _loader(
    server: S3TestServer | MotoServer, cache_dir: Path | None, **kw: object
) -> al.ImageLoader:
    kw.setdefault("batch_size", 16)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    url = "s3://b/train/" if isinstance(server, S3TestServer) else "s3://data/train/"
    return al.ImageLoader(
        url,
        cache_dir=cache_dir,
        **kw,
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),  # type: ignore[arg-type]
    )


def _epoch(loader: al.ImageLoader, epoch: int) -> tuple[list[int], np.ndarray]:
    loader.set_epoch(epoch)
    labels, pixels = [], []
    for images, lab in loader:
        labels += lab.tolist()
        pixels.append(images.numpy().copy())
    return labels, np.concatenate(pixels)


def test_second_epoch_is_served_from_disk(light_server: S3TestServer, tmp_path: Path) -> None:
    with _loader(
        light_server, tmp_path / "c", shuffle=False, engine=al.EngineConfig(prefetch_batches=2)
    ) as loader:
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


@pytest.mark.parametrize("written", ["at close", "as usual"])
def test_each_object_is_fetched_once_while_later_batches_need_it(
    light_server: S3TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    """The loader runs ahead into the next epoch while this one is fetched and written: a
    batch needing an object another batch is fetching shares that fetch, and one whose
    bytes still wait for the writer decodes them (a hit), so with a cache each object is
    fetched once, whatever the timing; the pixels are those of a run without a cache."""
    from asyncloader._cache._writer import CacheWriter

    # GETs are counted at the server: no hedge (a second request of the same fetch, sent
    # when a busy machine delays an answer past the learned deadline) may add to them.
    once = al.FetchConfig(hedge=False)
    with _loader(light_server, None, seed=1) as loader:
        expected = [_epoch(loader, e) for e in (0, 1)]
    gets = light_server.stats()["counters"]["get"]
    if written == "at close":  # a writer that writes nothing before the loader closes
        assert CacheWriter.__init__.__kwdefaults__ is not None
        monkeypatch.setitem(CacheWriter.__init__.__kwdefaults__, "linger", 600.0)
        monkeypatch.setattr(CacheWriter, "_BATCH", 10_000)
    with _loader(
        light_server,
        tmp_path / "c",
        seed=1,
        engine=al.EngineConfig(prefetch_batches=4),
        fetch=once,
    ) as loader:
        got = [_epoch(loader, e) for e in (0, 1)]
    stats = loader.stats()
    assert light_server.stats()["counters"]["get"] - gets == N_IMAGES  # each object once
    assert stats.cache_misses == N_IMAGES and stats.cache_hits >= N_IMAGES
    assert stats.cache_stored == N_IMAGES
    for (labels, pixels), (want_labels, want_pixels) in zip(got, expected, strict=True):
        assert labels == want_labels and np.array_equal(pixels, want_pixels)
    with _loader(light_server, tmp_path / "c", seed=1) as loader:  # all on disk now
        assert np.array_equal(_epoch(loader, 1)[1], expected[1][1])
        assert loader.stats().cache_hits >= N_IMAGES
    assert light_server.stats()["counters"]["get"] - gets == N_IMAGES


@pytest.mark.parametrize("shuffle", [True, False])
def test_an_object_written_after_a_batch_looked_is_read_from_the_cache_not_fetched(
    light_server: S3TestServer, tmp_path: Path, shuffle: bool
) -> None:
    """A batch whose index query ran before another batch fetched and wrote one of its
    objects, and whose own fetch of it would start after that write, reads it from the
    cache (the writer remembers what it wrote last): a small dataset, three batches an
    epoch, and the loader runs epochs ahead with few requests in flight, so the samples of
    later batches wait while earlier ones fetch and write theirs."""
    # Few requests in flight, and no hedge (GETs are counted at the server: see above).
    fetch = al.FetchConfig(max_inflight=4, hedge=False)
    with _loader(light_server, None, seed=2, shuffle=shuffle, batch_size=32) as loader:
        expected = [_epoch(loader, e) for e in (0, 1, 2)]
    gets = light_server.stats()["counters"]["get"]
    with _loader(
        light_server, tmp_path / "c", seed=2, shuffle=shuffle, batch_size=32, fetch=fetch
    ) as loader:
        got = [_epoch(loader, e) for e in (0, 1, 2)]
    stats = loader.stats()
    assert light_server.stats()["counters"]["get"] - gets == N_IMAGES  # each object once
    assert stats.cache_misses == N_IMAGES and stats.cache_stored == N_IMAGES
    assert stats.cache_hits >= 2 * N_IMAGES
    for (labels, pixels), (want_labels, want_pixels) in zip(got, expected, strict=True):
        assert labels == want_labels and np.array_equal(pixels, want_pixels)


def test_later_run_uses_the_cache_and_matches_uncached_pixels(
    moto: MotoServer, moto_dataset: str, tmp_path: Path
) -> None:
    with _loader(moto, tmp_path / "c", seed=3) as loader:
        labels_cold, cold = _epoch(loader, 5)
    engines = al.EngineConfig(processes=2)  # another layout reads the same entries
    with _loader(moto, tmp_path / "c", seed=3, engine=engines) as loader:
        labels_warm, warm = _epoch(loader, 5)
        stats = loader.stats()
    assert labels_cold == labels_warm
    assert np.array_equal(cold, warm)
    assert stats.cache_hits >= N_IMAGES
    assert stats.requests == 0  # the whole run came from disk, in both engine processes
    with al.ImageLoader(
        moto_dataset,
        batch_size=16,
        seed=3,
        store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
    ) as loader:
        _, uncached = _epoch(loader, 5)
    assert np.array_equal(uncached, warm)


def test_damaged_entry_is_dropped_and_refetched(light_server: S3TestServer, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    with _loader(
        light_server, cache_dir, shuffle=False, engine=al.EngineConfig(prefetch_batches=2)
    ) as loader:
        _, first = _epoch(loader, 0)
    cache = ObjectCache(cache_dir)
    where = cache.locate(list(cache.entry_keys()))
    places = sorted(
        (w for w in where.values() if w is not None), key=lambda w: (w.filename, w.offset)
    )
    assert len(places) == N_IMAGES and all(w.offset >= 0 for w in places)  # all in packs
    for w in places[:3]:  # a flipped byte inside three entries
        with open(cache_dir / "packs" / w.filename, "r+b") as f:
            f.seek(w.offset + w.length // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0xFF]))
    last = places[-1]  # the last entry of a pack, truncated on disk
    os.truncate(cache_dir / "packs" / last.filename, last.offset + 100)
    light_server.reset_stats()
    with _loader(
        light_server,
        cache_dir,
        shuffle=False,
        engine=al.EngineConfig(prefetch_batches=2),
        fetch=al.FetchConfig(hedge=False),  # GETs are counted at the server
    ) as loader:
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
    with _loader(light_server, cache_dir, cache=al.CacheConfig(size=limit)) as loader:
        for epoch in range(2):
            labels, _ = _epoch(loader, epoch)
            assert len(labels) == N_IMAGES
    stats = ObjectCache(cache_dir, size_limit=limit).stats()
    # Whole packs (a 16th of the limit each) go, oldest first; the one being written stays.
    assert stats.volume <= limit * (1 + 1 / 16) + 200_000
    assert 0 < stats.entries < N_IMAGES
    on_disk = sum(p.stat().st_size for p in (cache_dir / "packs").glob("*.pack"))
    assert on_disk <= limit * (1 + 1 / 16) + 200_000


def test_parse_size() -> None:
    assert parse_size("500GB") == 500 * 10**9
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size(" 1.5 mb ") == 1_500_000
    assert parse_size(123) == 123
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def _number_of(key: str) -> int:
    return int(key.split("/")[-1].split(".")[0].split("_")[-1])


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
            shard=al.ShardConfig(local_world_size=1),
            labels=_number_of,  # at module level: engine processes import it
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
        shard=al.ShardConfig(local_world_size=1),
    ) as loader:
        for epoch in range(2):
            _epoch(loader, epoch)
        assert loader.stats().requests == 0  # everything this node reads was warmed


def test_entries_of_the_older_value_layout_are_still_read(tmp_path: Path) -> None:
    """Values used to be a file each (diskcache's own layout); a cache written that way is
    read, verified and cleared beside entries in packs."""
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
    assert old_at.offset < 0 and old_at.filename.endswith(".val")
    assert new_at.offset >= 0 and new_at.filename.endswith(".pack")
    assert cache.read("old", len(value), old_at) == value
    assert cache.get("old", len(value)) == value
    assert cache.get("new", len(value)) == value
    assert cache.read("new", len(value), new_at) == value
    assert cache.verify() == (2, 0)
    assert cache.clear() == 2
    assert list((tmp_path / "objects").rglob("*.val")) == []
    assert list((tmp_path / "packs").glob("*.pack")) == []


def _value(i: int, size: int = 40_000) -> bytes:
    return i.to_bytes(4, "big") * (size // 4)


def test_eviction_drops_the_oldest_pack_whole(tmp_path: Path) -> None:
    """Least-recently-stored, a pack at a time: what goes is always the oldest entries, the
    rest stays readable, and the folder stays within the limit plus the pack being filled."""
    limit = 1_000_000  # packs of 62 500 bytes: an entry or two each
    cache = ObjectCache(tmp_path, size_limit=limit)
    for i in range(100):
        cache.put_many([(f"k{i}", _value(i))])
    kept = [i for i in range(100) if cache.get(f"k{i}", 40_000) is not None]
    assert kept == list(range(100 - len(kept), 100))  # the newest, in one run
    assert 15 <= len(kept) < 100
    assert all(cache.get(f"k{i}", 40_000) == _value(i) for i in kept)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "packs").glob("*.pack"))
    assert on_disk <= limit + cache.pack_size + 40_000
    assert cache.stats().entries == len(kept)
    assert cache.verify() == (len(kept), 0)


def test_heads_are_whole_verified_values_or_the_first_bytes_of_longer_ones(
    tmp_path: Path,
) -> None:
    """``heads``: of each key held, the first ``n`` bytes — a value of at most ``n`` bytes
    read whole and verified (a damaged one dropped, as a read drops it), of a longer one
    the first ``n`` bytes of its pack; keys not held, and an entry whose pack was cut
    short, left out."""
    cache = ObjectCache(tmp_path)
    small, packed, long, damaged, short = (
        b"s" * 1000,
        _value(1),
        _value(2, 90_000),
        _value(3),
        _value(4, 90_000),
    )
    cache.put_many([("small", small), ("packed", packed), ("long", long), ("damaged", damaged)])
    cache.put_many([("short", short)])  # the pack's last entry
    at = cache.locate(["packed", "long", "damaged", "short"])
    assert all(w is not None and w.offset >= 0 for w in at.values())
    assert cache.locate(["small"]) == {"small": None}  # kept inside the index
    bad, cut = at["damaged"], at["short"]
    assert bad is not None and cut is not None
    with open(tmp_path / "packs" / bad.filename, "r+b") as f:
        f.seek(bad.offset + 100)
        f.write(b"\x00\xff")
    os.truncate(tmp_path / "packs" / cut.filename, cut.offset + 30_000)
    keys = ["small", "packed", "long", "damaged", "short", "absent"]
    assert cache.heads(keys, 50_000) == {
        "small": small,
        "packed": packed,
        "long": long[:50_000],  # unverified: its CRC is of all 90 000 bytes
    }
    assert cache.take_damaged() == 1 and cache.get("damaged", len(damaged)) is None
    assert cache.heads(["short"], 20_000) == {"short": short[:20_000]}  # held that far
    cache.close()


@pytest.mark.parametrize("limit", [10_000_000, 1_000_000])
def test_whole_images_a_header_pass_fetched_are_kept_as_a_loader_keeps_them(
    tmp_path: Path, limit: int
) -> None:
    """``CacheHeads.keeper``: the whole objects header reads fetched go into the cache
    under the loader's keys, all of them where they fit, else the subset the cache's
    admission takes (over the objects whose headers are read); ``heads`` then finds them."""
    from asyncloader._run._cache_fill import CacheHeads, entry_key
    from asyncloader.testing import MemoryStore

    store = MemoryStore(name="heads")
    objects = [ObjectInfo(f"img{i}.jpg", 40_000, f"e{i}") for i in range(50)]  # 2 MB
    cache = ObjectCache(tmp_path, size_limit=limit)
    heads = CacheHeads(cache)
    keep = heads.keeper(store, objects)
    threshold, share = admission([(o.key, o.size) for o in objects], limit)
    taken = [o for o in objects if admitted(o.key, threshold)]
    assert (share == 1.0) == (limit > 2_000_000) and 0 < len(taken) <= len(objects)
    assert keep([(o, _value(i)) for i, o in enumerate(objects)]) == len(taken)
    held = {k.split("\x00")[1] for k in cache.entry_keys()}
    assert held == {o.key for o in taken}
    assert ObjectCache.entry_key(store.url, "img0.jpg", "e0") == entry_key(store, "img0.jpg", "e0")
    found = heads(store, objects, 100)
    assert found == {i: _value(i)[:100] for i, o in enumerate(objects) if o in taken}


def test_a_batch_written_in_part_by_each_call_lands_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's values go to the pack in one gathered write where the OS takes it all; a
    write that takes only part (a signal, a slow disk) is continued where it stopped."""
    sizes: list[int] = []

    def stingy(fd: int, views: list[memoryview]) -> int:  # at most 25 000 bytes a call
        sizes.append(sum(len(v) for v in views))
        return os.write(fd, b"".join(bytes(v) for v in views)[:25_000])

    monkeypatch.setattr("asyncloader._cache._pack._writev", stingy)
    cache = ObjectCache(tmp_path, size_limit=10**9)
    values = [(f"k{i}", _value(i, 40_000 + 996 * i)) for i in range(5)]
    cache.put_many(values)
    assert all(cache.get(k, len(v)) == v for k, v in values)
    assert cache.verify() == (5, 0)
    total = sum(len(v) for _, v in values)
    assert sizes[0] == total and len(sizes) == -(-total // 25_000)


def test_a_pack_evicted_under_its_writer_is_left_for_a_new_one(tmp_path: Path) -> None:
    """Another process evicts (or clears) the pack this one appends to: the next batch goes
    to a new pack, nothing is indexed into the removed one."""
    writer = ObjectCache(tmp_path, size_limit=10**9)
    writer.put_many([("a", _value(1))])
    other = ObjectCache(tmp_path, size_limit=10**9)
    assert other.clear() == 1  # removes the writer's pack file and its row
    assert not list((tmp_path / "packs").glob("*.pack"))
    writer.put_many([("b", _value(2)), ("c", _value(3))])
    assert writer.get("a", 40_000) is None
    assert writer.get("b", 40_000) == _value(2) and other.get("c", 40_000) == _value(3)
    where = other.locate(["b", "c"])
    assert all(w is not None and (tmp_path / "packs" / w.filename).exists() for w in where.values())
    assert other.verify() == (2, 0)


def _put_range(directory: str, start: int) -> None:
    cache = ObjectCache(directory)
    for i in range(start, start + 40, 4):
        cache.put_many([(f"k{j}", _value(j)) for j in range(i, i + 4)])
    cache.close()


def test_processes_append_to_their_own_packs_and_share_the_index(tmp_path: Path) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_put_range, args=(str(tmp_path), 40 * n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = ObjectCache(tmp_path)
    assert all(cache.get(f"k{i}", 40_000) == _value(i) for i in range(120))
    assert len(list((tmp_path / "packs").glob("*.pack"))) == 3
    assert cache.verify() == (120, 0)


def test_cache_writer_batches_reports_and_fails_loudly(tmp_path: Path) -> None:
    """The write-behind thread: every object is reported written or failed (never dropped
    silently), ``full`` bounds what waits, and ``drain`` waits for what was handed over."""
    import asyncio

    from asyncloader._cache._writer import CacheWriter

    written: list[str] = []
    failed: list[tuple[str, str]] = []

    def done(keys: list[str], error: Exception | None) -> None:
        if error is None:
            written.extend(keys)
        else:
            failed.extend((k, type(error).__name__) for k in keys)

    async def main(cache: ObjectCache, n: int) -> CacheWriter:
        writer = CacheWriter(cache, max_bytes=200_000, done=done)
        for i in range(n):
            if writer.full():
                await writer.room()
            writer.submit(f"obj{i}", f"k{i}", _value(i))
            assert not writer.full() or i >= 4  # 5 values of 40 000 bytes reach the bound
        await writer.drain()
        return writer

    cache = ObjectCache(tmp_path / "ok")
    writer = asyncio.run(main(cache, 100))
    assert sorted(written) == sorted(f"obj{i}" for i in range(100)) and not failed
    writer.close()
    assert all(cache.get(f"k{i}", 40_000) == _value(i) for i in range(100))
    if os.path.isdir("/proc/self/fd"):  # the thread's pack file is closed with it
        open_files = [os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
        assert not [f for f in open_files if f.startswith(str(tmp_path / "ok" / "packs"))]

    written.clear()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "packs").write_bytes(b"a file where the pack folder goes")
    writer = asyncio.run(main(ObjectCache(tmp_path / "broken"), 10))
    writer.close()
    assert not written
    assert sorted(k for k, _ in failed) == sorted(f"obj{i}" for i in range(10))
    assert {e for _, e in failed} == {"NotADirectoryError"}


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux: thread switches")
def test_the_writer_sleeps_through_its_linger_instead_of_waking_for_each_object(
    tmp_path: Path,
) -> None:
    """Each wake-up of the writer thread takes the GIL from the threads that fetch and
    decode: while it gathers a batch it sleeps until the batch is due."""
    import asyncio

    from asyncloader._cache._writer import CacheWriter

    def switches(tid: int) -> int:
        with open(f"/proc/self/task/{tid}/status") as f:
            line = next(x for x in f if x.startswith("voluntary_ctxt_switches"))
        return int(line.split()[1])

    batches: list[int] = []

    async def main(cache: ObjectCache) -> int:
        writer = CacheWriter(cache, done=lambda keys, _: batches.append(len(keys)), linger=600.0)
        tid = writer._thread.native_id
        writer.submit("obj0", "k0", _value(0))
        await asyncio.sleep(0.1)  # the writer has its first object and lingers
        before = switches(tid)
        for i in range(1, 25):
            writer.submit(f"obj{i}", f"k{i}", _value(i))
            await asyncio.sleep(0.002)
        woke = switches(tid) - before
        await asyncio.wait_for(writer.drain(), 60)
        await asyncio.to_thread(writer.close)
        return woke

    woke = asyncio.run(main(ObjectCache(tmp_path / "c")))
    assert batches == [25]
    assert woke < 8, f"the writer woke {woke} times for 24 objects"


def test_the_writer_gathers_objects_that_come_one_by_one_into_one_transaction(
    tmp_path: Path,
) -> None:
    """Objects handed over a few milliseconds apart are written as one batch (one index
    transaction), not one each; ``drain`` and ``close`` write a gathering batch at once."""
    import asyncio

    from asyncloader._cache._writer import CacheWriter

    batches: list[list[str]] = []
    written = threading.Event()  # a first batch is written

    def done(keys: list[str], error: Exception | None) -> None:
        assert error is None
        batches.append(keys)
        written.set()

    async def main(cache: ObjectCache) -> None:
        writer = CacheWriter(cache, done=done, linger=600.0)  # only full batches on their own
        try:
            for i in range(40):
                writer.submit(f"obj{i}", f"k{i}", _value(i))
                await asyncio.sleep(0.002)
            # The full batch is written on its own, however long the disk takes under load
            # (a fixed 0.2 s was not always enough beside the suite's other worker).
            assert await asyncio.to_thread(written.wait, 60)
            await asyncio.sleep(0.2)
            assert [len(b) for b in batches] == [32]  # the other 8 wait for more
            await asyncio.wait_for(writer.drain(), 60)  # far sooner than the linger
            assert [len(b) for b in batches] == [32, 8]
            writer.submit("obj40", "k40", _value(40))
            writer.submit("obj41", "k41", _value(41))
        finally:
            await asyncio.to_thread(writer.close)  # writes them, without waiting the linger
        assert [len(b) for b in batches] == [32, 8, 2]

    cache = ObjectCache(tmp_path / "c")
    asyncio.run(asyncio.wait_for(main(cache), 120))
    assert [k for b in batches for k in b] == [f"obj{i}" for i in range(42)]
    assert all(cache.get(f"k{i}", 40_000) == _value(i) for i in range(42))

    # With the default linger, a trickle of objects still goes in batches.
    batches.clear()

    async def trickle(cache: ObjectCache) -> CacheWriter:
        writer = CacheWriter(cache, done=done)
        for i in range(60):
            writer.submit(f"obj{i}", f"t{i}", _value(i))
            await asyncio.sleep(0.001)
        await writer.drain()
        return writer

    writer = asyncio.run(asyncio.wait_for(trickle(ObjectCache(tmp_path / "t")), 120))
    writer.close()
    assert sorted(k for b in batches for k in b) == sorted(f"obj{i}" for i in range(60))
    assert len(batches) < 30


def test_a_cache_smaller_than_the_data_keeps_a_fixed_subset(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """Shuffled epochs through a cache a third of the data's size: a fixed subset (a hash of
    the key) is stored once and hit in every later epoch; nothing else is ever written, so
    nothing is evicted (storing everything kept almost nothing: 6 % hits)."""

    async def sizes() -> dict[str, int]:  # keys as the loader sees them: under train/
        store = al.S3Store("b", prefix="train/", endpoint_url=light_server.endpoint)
        try:
            return {o.key: o.size async for o in store.list() if o.key.endswith(".jpg")}
        finally:
            await store.close()

    listed = asyncio.run(sizes())
    total = sum(listed.values())
    limit = total // 3
    threshold, share = admission(listed.items(), limit)
    assert 0.25 < share <= 0.3  # 90 % of a third
    kept = {k for k in listed if admitted(k, threshold)}
    assert sum(listed[k] for k in kept) == pytest.approx(share * total)
    assert 0 < len(kept) < N_IMAGES / 2
    cache = ObjectCache(tmp_path / "c", size_limit=limit)
    for epoch in range(3):  # a run per epoch: each starts from what the last one stored
        light_server.reset_stats()
        with _loader(light_server, tmp_path / "c", cache=al.CacheConfig(size=limit)) as loader:
            labels, _ = _epoch(loader, epoch)
            stats = loader.stats()  # (the stream has started on the next epoch, too)
        assert len(labels) == N_IMAGES
        assert stats.cache_share == pytest.approx(share)
        assert {k.split("\x00")[1] for k in cache.entry_keys()} == kept
        fetched = {k[len("train/") :] for k in light_server.stats()["gets_by_key"]}
        if epoch > 0:  # the subset from disk, the rest from the store and never written
            assert stats.cache_stored == 0 and not fetched & kept
            assert stats.cache_hits >= len(kept)
            assert fetched == set(listed) - kept
    assert cache.stats().volume <= limit


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=200),
    limits=st.tuples(st.integers(1, 10**8), st.integers(1, 10**8)),
)
def test_admission_fills_the_cache_with_a_stable_subset(
    sizes: list[int], limits: tuple[int, int]
) -> None:
    """Everything when it fits; else the objects of lowest hash rank that fit in 90 % of
    the limit (the next one would not); a larger cache keeps a superset."""
    from asyncloader._cache._admission import ADMIT_ALL, ADMIT_HEADROOM, _rank, admission, admitted

    objects = {f"k{i}": n for i, n in enumerate(sizes)}
    small, large = sorted(limits)
    kept = {}
    for limit in (small, large):
        threshold, share = admission(objects.items(), limit)
        kept[limit] = {k for k in objects if admitted(k, threshold)}
        total, got = sum(sizes), sum(objects[k] for k in kept[limit])
        if total <= limit:
            assert threshold == ADMIT_ALL and len(kept[limit]) == len(objects)
        else:
            assert got <= ADMIT_HEADROOM * limit
            assert got == pytest.approx(share * total)
            left = [k for k in objects if k not in kept[limit]]
            assert all(_rank(k) < _rank(x) for k in kept[limit] for x in left)
            assert got + objects[min(left, key=_rank)] > ADMIT_HEADROOM * limit
    assert kept[small] <= kept[large]


LIST_AND_COUNT = """
import sys, asyncloader as al

def count(endpoint, cache_dir, stream):
    with al.ImageLoader(
        "s3://b/train/", batch_size=8, decode=al.DecodeConfig(workers=1),
        transform=al.RandomResizedCrop(32),  # the listing is the subject, not the decode
        engine=al.EngineConfig(mode="inline"),  # nor engine processes: three loaders list
        shuffle=not stream, cache_dir=cache_dir,
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        return sum(len(labels) for _, labels in loader)

if __name__ == "__main__":
    print(count(sys.argv[1], sys.argv[2], sys.argv[3] == "1"))
"""


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_loaders_of_a_node_starting_together_list_once(
    light_server: S3TestServer, tmp_path: Path, stream: bool
) -> None:
    """Three processes start on one cache folder at once: one lists (and saves), the others
    wait their turn and read its listing; the store sees one listing's LIST requests.
    Unshuffled, the first streams its listing and the others wait for the end of it."""
    import subprocess
    import sys

    script = tmp_path / "count.py"
    script.write_text(LIST_AND_COUNT)
    # One loader alone, here (the same code; a process less): one listing's LIST requests.
    light_server.reset_stats()
    solo: dict[str, Any] = {"__name__": "count"}
    exec(LIST_AND_COUNT, solo)
    assert solo["count"](light_server.endpoint, str(tmp_path / "solo"), stream) == N_IMAGES
    one_listing = light_server.stats()["counters"]["list"]
    assert one_listing >= 1
    light_server.reset_stats()
    args = [light_server.endpoint, str(tmp_path / "shared"), str(int(stream))]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert [int(out) for out, _ in outs] == [N_IMAGES] * 3
    assert light_server.stats()["counters"]["list"] == one_listing


class _Tracked(sqlite3.Connection):
    """A connection that knows whether it was closed, rather than left to the collector."""

    closed_explicitly = False

    def close(self) -> None:
        self.closed_explicitly = True
        super().close()


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, _Tracked]]:
    """Every SQLite connection opened during the test, with its thread's name."""
    opened: list[tuple[str, _Tracked]] = []
    connect = sqlite3.connect

    def tracked(*args: object, **kw: object) -> sqlite3.Connection:
        con = connect(*args, factory=_Tracked, **kw)  # type: ignore[call-overload]
        opened.append((threading.current_thread().name, con))
        return con  # type: ignore[no-any-return]

    monkeypatch.setattr(sqlite3, "connect", tracked)
    return opened


def test_every_index_connection_is_closed_by_its_thread(
    light_server: S3TestServer, tmp_path: Path, connections: list[tuple[str, _Tracked]]
) -> None:
    """Each thread that reads or writes the cache (index queries, decode threads reading
    hits, the writer, warm's reads) closes its SQLite connection before it ends: no other
    thread can, and Python 3.13 warns of every connection left to the garbage collector."""
    al.warm(
        "s3://b/train/",
        tmp_path / "c",
        shard=(0, 2),
        store_options={"endpoint_url": light_server.endpoint},
    )
    with _loader(light_server, tmp_path / "c", shuffle=False) as loader:
        _epoch(loader, 0)  # half from the cache, half fetched and written
        _epoch(loader, 0)  # all from the cache
    left = sorted(name for name, con in connections if not con.closed_explicitly)
    assert len(connections) >= 4, [name for name, _ in connections]
    assert not left, f"connections left open by {left}"
    # The application's own look at a cache: in a `with` block, or in one statement.
    before = len(connections)
    with ObjectCache(tmp_path / "c") as cache:
        assert sum(1 for _ in cache.entry_keys()) == N_IMAGES
    assert ObjectCache(tmp_path / "c").stats().entries == N_IMAGES
    assert len(connections) > before
    assert all(con.closed_explicitly for _, con in connections[before:])


def test_the_index_thread_asks_in_order_and_closes_its_own_connection(
    tmp_path: Path, connections: list[tuple[str, _Tracked]]
) -> None:
    cache = ObjectCache(tmp_path / "c")
    index = IndexThread(cache.close, "probe-index")

    async def ask() -> list[object]:
        cache.put("k", b"x" * 100)  # from the loop's thread: its own connection
        return await asyncio.gather(
            index.run(cache.contains, ["k", "absent"]),
            index.run(threading.current_thread),  # queued behind the query: one thread
        )

    present, thread = asyncio.run(ask())
    assert present == {"k"}
    assert isinstance(thread, threading.Thread) and thread.name.startswith("probe-index")
    index.close()
    index.close()  # a second close is a no-op, not "cannot schedule after shutdown"
    assert not thread.is_alive()
    ours = [con for name, con in connections if name.startswith("probe-index")]
    assert ours and all(con.closed_explicitly for con in ours)
    cache.close()


def test_a_damaged_entry_read_by_several_threads_at_once_counts_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers that find the same damaged entry together (jobs of this epoch and of the
    next one being prefetched, on a machine with many decode threads) all get a miss, but
    the entry is one damaged entry: counted by the reader that drops it, not by each."""
    from asyncloader import _cache

    cache = ObjectCache(tmp_path)
    value = _value(7)
    cache.put("k", value)
    where = cache.locate(["k"])["k"]
    assert where is not None and where.offset >= 0
    with open(tmp_path / "packs" / where.filename, "r+b") as f:
        f.seek(where.offset + 100)
        f.write(b"\x00\xff")
    readers = 3
    together = threading.Barrier(readers, timeout=10)
    crc = _cache._crc32

    def crc_once_all_have_read(data: bytes) -> int:
        together.wait()  # every reader holds the damaged bytes before any drops them
        return crc(data)

    monkeypatch.setattr(_cache, "_crc32", crc_once_all_have_read)
    got: list[bytes | None] = []
    counted: list[int] = []

    def read(use_get: bool) -> None:
        got.append(cache.get("k", len(value)) if use_get else cache.read("k", len(value), where))
        counted.append(cache.take_damaged())

    threads = [threading.Thread(target=read, args=(i % 2 == 0,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == [None] * readers
    assert sum(counted) == 1
    monkeypatch.setattr(_cache, "_crc32", crc)
    assert cache.get("k", len(value)) is None and cache.take_damaged() == 0  # dropped


def test_a_new_cache_folder_is_its_owner_s_only_or_its_group_s(tmp_path: Path) -> None:
    """On a shared node every user could read the cached objects of a private bucket from
    a world-readable folder: a missing one is made drwx------, or drwxrws--- when the
    group shares it; a folder that exists keeps its permissions."""
    import stat

    private = ObjectCache(tmp_path / "a" / "private")
    private.put("k", b"x" * 100)
    assert stat.S_IMODE(os.stat(private.directory).st_mode) == 0o700
    private.close()
    shared = ObjectCache(tmp_path / "shared", group_shared=True)
    shared.make_folder()
    assert stat.S_IMODE(os.stat(shared.directory).st_mode) == 0o2770
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    kept = ObjectCache(mine)
    kept.put("k", b"y" * 100)
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o755
    kept.close()


def test_an_index_of_another_layout_is_refused_not_written_into(tmp_path: Path) -> None:
    """The pack entries are rows of diskcache's own table: a table with other columns (as
    a future diskcache could make) is a clear error at open, before anything is written."""
    import diskcache

    folder = tmp_path / "c" / "objects"
    db = diskcache.Cache(folder)
    db.close()
    con = sqlite3.connect(folder / "cache.db")
    con.execute("ALTER TABLE Cache ADD COLUMN checksum TEXT")  # a layout of the future
    con.commit()
    con.close()
    cache = ObjectCache(tmp_path / "c")
    with pytest.raises(al.CacheFormatError, match=r"'checksum'\),.*diskcache 5"):
        cache.put("k", b"z" * 100)
    assert not (tmp_path / "c" / "packs").exists()  # nothing written
