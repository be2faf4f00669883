"""The S3 store and the fetcher against moto_server (a real HTTP server on 127.0.0.1).

Listing, ranges, missing objects and throttling are in the conformance suite
(tests/test_conformance.py); these are the S3- and fetcher-specific cases."""

from __future__ import annotations

import asyncio
import os

import pytest

from asyncloader import FetchConfig, IntegrityError, ObjectNotFound, S3Store
from asyncloader._fetch import Fetcher
from asyncloader._stats import Counters
from asyncloader.testing import MotoServer


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


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
