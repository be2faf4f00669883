"""The images' headers, read for their sizes (``_dataset/_headers.py``): in the node's cache
where it holds the image, else one range read per object from the store; an image that
read fetched whole is handed to the cache in bounded chunks, only where it stays a sample
(every image read, or those a filter on the sizes keeps)."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from PIL import Image

from asyncloader._base._stats import Counters
from asyncloader._base._types import ObjectInfo, ObjectStore
from asyncloader._cache import ObjectCache
from asyncloader._dataset import _headers
from asyncloader._dataset._headers import HEAD_BYTES, Keep, Stays, every_one, read_headers
from asyncloader._run._cache_fill import CacheHeads
from asyncloader.testing import MemoryStore


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20 + i, 10 + 2 * i), (9 * i, 80, 40)).save(buf, "JPEG")
    return buf.getvalue()


class _Counted(CacheHeads):
    """The cache as the header pass sees it, counting its hand-overs."""

    def __init__(self, cache: ObjectCache) -> None:
        super().__init__(cache)
        self.handed: list[int] = []
        self.threads: set[int] = set()  # where the hand-overs ran
        self.closed: list[int] = []  # where the keeper was closed

    def keeper(self, store: ObjectStore, objects: Sequence[ObjectInfo]) -> Keep:
        return _CountedKeep(super().keeper(store, objects), self)


class _CountedKeep:
    def __init__(self, keep: Keep, heads: _Counted) -> None:
        self.keep, self.heads = keep, heads

    def __call__(self, items: Sequence[tuple[ObjectInfo, bytes]]) -> int:
        self.heads.handed.append(len(items))
        self.heads.threads.add(threading.get_ident())
        return self.keep(items)

    def close(self) -> None:
        self.heads.closed.append(threading.get_ident())
        self.keep.close()


def _wide(keys: Sequence[str], sizes: Sequence[tuple[int, int]]) -> list[bool]:
    """A filter on the sizes: ``width >= 35`` (images 15 to 29 of :func:`_jpeg`'s)."""
    return [size[1] >= 35 for size in sizes]


@pytest.mark.parametrize("stays", [every_one, _wide, None], ids=["every", "filter", "none"])
def test_whole_images_go_to_the_cache_in_chunks_and_are_read_there_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stays: Stays | None
) -> None:
    data = {f"i{i:02d}.jpg": _jpeg(i) for i in range(30)}
    big = b"\xff\xd8" + b"\x00" * (HEAD_BYTES + 10)  # no header in its first read: not kept
    store = MemoryStore({**data, "big.jpg": big}, name="heads")
    listed = asyncio.run(_listed(store))
    objects = [o for o in listed if o.key != "big.jpg"]
    chunk = 3 * max(len(d) for d in data.values())
    monkeypatch.setattr(_headers, "_KEEP_CHUNK", chunk)
    cache = ObjectCache(tmp_path)
    heads = _Counted(cache)
    counters = Counters()
    found, failed = asyncio.run(read_headers(store, objects, counters, heads, stays=stays))
    want = {i: (10 + 2 * int(o.key[1:3]), 20 + int(o.key[1:3])) for i, o in enumerate(objects)}
    assert found == want and failed == {}
    assert counters.requests == len(objects)
    staying = {
        o.key for i, o in enumerate(objects) if stays is not None and stays([o.key], [want[i]])[0]
    }
    assert len(staying) == {"every": 30, "filter": 15, "none": 0}[_id(stays)]
    if staying:  # those, in several hand-overs of a few images each, on one thread
        assert sum(heads.handed) == len(staying) == counters.cache_stored
        assert len(heads.handed) >= len(staying) // 4 and max(heads.handed) <= 4
        assert {k.split("\x00")[1] for k in cache.entry_keys()} == staying
        assert len(heads.threads) == 1
        for _ in range(100):  # closed there once its work is done
            if heads.closed:
                break
            time.sleep(0.05)
        assert heads.closed == list(heads.threads)
    else:  # none of them is known to be a sample
        assert heads.handed == [] and counters.cache_stored == 0
        assert list(cache.entry_keys()) == []
    # Again: from the cache where it holds them, the store only for the rest.
    again = Counters()
    found, failed = asyncio.run(read_headers(store, objects, again, heads, stays=stays))
    assert found == want and failed == {}
    assert again.requests == len(objects) - len(staying)
    # An object whose first read holds no header is read again further, then fails as the
    # image's own fault: it is never kept.
    _, failed = asyncio.run(
        read_headers(
            store, [o for o in listed if o.key == "big.jpg"], Counters(), heads, stays=every_one
        )
    )
    assert list(failed) == [0] and "big.jpg" in str(failed[0])
    assert "big.jpg" not in {k.split("\x00")[1] for k in cache.entry_keys()}
    cache.close()


def _id(stays: Stays | None) -> str:
    return {every_one: "every", _wide: "filter", None: "none"}[stays]


async def _listed(store: MemoryStore) -> list[ObjectInfo]:
    return sorted([o async for o in store.list()], key=lambda o: o.key)
