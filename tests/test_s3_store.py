"""The S3 store and the fetcher against moto_server (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from asyncloader import FetchConfig, IntegrityError, ObjectInfo, ObjectNotFound, S3Store, open_store
from asyncloader._pipeline import Fetcher
from asyncloader._stats import Counters
from asyncloader.testing import MotoServer


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def many(moto: MotoServer) -> int:
    """1100 small objects under many/ (more than one 1000-key listing page)."""
    moto.create_bucket("many")
    n = 1100
    with ThreadPoolExecutor(16) as ex:
        list(
            ex.map(
                lambda i: moto.put("many", f"p/{i % 7}/obj{i:05d}.bin", str(i).encode()), range(n)
            )
        )
    return n


def test_listing_paginates_past_1000(moto: MotoServer, many: int) -> None:
    async def main() -> list[ObjectInfo]:
        store = S3Store("many", "p/", endpoint_url=moto.endpoint)
        try:
            return [o async for o in store.list()]
        finally:
            await store.close()

    objs = run(main())
    assert len(objs) == many
    assert len({o.key for o in objs}) == many
    assert all(not o.key.startswith("p/") for o in objs)  # relative to the store root
    sample = next(o for o in objs if o.key == "3/obj00010.bin")
    assert sample.size == 2 and sample.etag


def test_get_stat_range_and_missing(moto: MotoServer, many: int) -> None:
    async def main() -> None:
        store = open_store("s3://many/p", endpoint_url=moto.endpoint)
        try:
            info = await store.stat("3/obj00010.bin")
            assert info.size == 2
            assert await store.get("3/obj00010.bin") == b"10"
            assert await store.get("3/obj00010.bin", start=1, end=2) == b"0"
            assert await store.get("3/obj00010.bin", etag=info.etag) == b"10"
            with pytest.raises(ObjectNotFound, match=r"s3://many/p/nope\.bin"):
                await store.get("nope.bin")
            with pytest.raises(ObjectNotFound):
                await store.stat("nope.bin")
            with pytest.raises(IntegrityError, match="changed since it was listed"):
                await store.get("3/obj00010.bin", etag="0" * 32)
        finally:
            await store.close()

    run(main())


def test_multi_megabyte_object_reassembled_byte_exact(moto: MotoServer) -> None:
    moto.create_bucket("big")
    blob = os.urandom(5 * 1024 * 1024 + 12345)
    moto.put("big", "blob.bin", blob)

    async def main() -> tuple[bytes, Counters]:
        store = S3Store("big", endpoint_url=moto.endpoint)
        counters = Counters()
        fetcher = Fetcher(store, counters, FetchConfig(range_threshold=1 << 20, part_size=1 << 20))
        try:
            info = await store.stat("blob.bin")
            return await fetcher.fetch(info), counters
        finally:
            await store.close()

    data, counters = run(main())
    assert data == blob
    assert counters.requests == 6  # five full 1 MiB parts and the tail, in parallel
    assert counters.bytes_fetched == len(blob)


def test_object_replaced_after_listing_is_refused(moto: MotoServer) -> None:
    moto.create_bucket("swap")
    moto.put("swap", "a.bin", b"old contents")

    async def main() -> None:
        store = S3Store("swap", endpoint_url=moto.endpoint)
        fetcher = Fetcher(store, Counters(), FetchConfig())
        try:
            listed = [o async for o in store.list()]
            await asyncio.to_thread(moto.put, "swap", "a.bin", b"new contents!!")
            with pytest.raises(IntegrityError, match=r"a\.bin"):
                await fetcher.fetch(listed[0])
        finally:
            await store.close()

    run(main())


def test_missing_bucket_is_a_clear_error(moto: MotoServer) -> None:
    async def main() -> None:
        store = S3Store("no-such-bucket", endpoint_url=moto.endpoint)
        try:
            with pytest.raises(ObjectNotFound, match="no-such-bucket"):
                [o async for o in store.list()]
        finally:
            await store.close()

    run(main())
