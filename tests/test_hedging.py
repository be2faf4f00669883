"""Hedged requests: a request not answered within a deadline learned from this run gets a
second, identical one; the first complete, verified answer wins.  Hedges are bounded."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import time
from pathlib import Path

import numpy as np
import pytest

import asyncloader as al
from asyncloader._base._stats import Counters
from asyncloader._base._types import UNSIZED
from asyncloader._fetch import Fetcher
from asyncloader.testing import FaultyStore, MemoryBucket, MemoryStore, S3TestServer

from .conftest import N_IMAGES


@pytest.fixture(scope="module")
def bucket(jpeg_folder: Path) -> MemoryBucket:
    return MemoryBucket(
        {p.relative_to(jpeg_folder).as_posix(): p.read_bytes() for p in jpeg_folder.rglob("*.jpg")}
    )


def _pixels(loader: al.ImageLoader) -> np.ndarray:
    return np.concatenate([images.numpy().copy() for images, _ in loader])


def _loader(store: al.ObjectStore, **kw: object) -> al.ImageLoader:
    kw.setdefault("transform", al.RandomResizedCrop(32))
    return al.ImageLoader(
        batch_size=16,
        **kw,
        store=al.StoreConfig(object_store=store),
        decode=al.DecodeConfig(workers=2),
    )  # type: ignore[arg-type]


def test_a_stalled_request_is_hedged_and_the_epoch_is_exact(bucket: MemoryBucket) -> None:
    with _loader(MemoryStore(bucket), shuffle=False) as loader:
        clean = _pixels(loader)
    store = FaultyStore(MemoryStore(bucket), stall_seconds=60)
    # The first request of two objects, one early (before any latency is known) and one
    # late, never answers in time.
    keys = bucket.sorted_keys()
    store.fail_next(1, keys[2], kind="stall")
    store.fail_next(1, keys[80], kind="stall")
    fetch = al.FetchConfig(hedge_min_samples=16)
    t0 = time.monotonic()
    with _loader(store, shuffle=False, fetch=fetch) as loader:
        hedged = _pixels(loader)
    stats = loader.stats()
    assert np.array_equal(hedged, clean)  # every sample once, byte-exact, in order
    assert store.faults["stall"] == 2
    assert stats.hedges_won >= 2 and stats.hedges_sent >= stats.hedges_won
    assert stats.skipped == {} and stats.retries == {}
    assert time.monotonic() - t0 < 30  # far less than one stall (60 s)


def test_hedges_are_bounded_by_their_share(bucket: MemoryBucket) -> None:
    # After a few quick answers, every first request stalls: hedging them all would double
    # the load; their share stops them.  The deadline is the quick answers' median (the
    # default, twice their 95th percentile, is twice the slowest of 16: on a loaded
    # machine one answer the loop saw late put it past the stall, and nothing was hedged).
    store = FaultyStore(MemoryStore(bucket), latency=0.002, stall_seconds=0.3)
    for key in bucket.sorted_keys()[16:]:
        store.fail_next(1, key, kind="stall")
    fetch = al.FetchConfig(
        hedge_min_samples=8,
        hedge_quantile=0.5,
        hedge_factor=1.0,
        hedge_share=0.1,
        hedge_min_inflight=2,
        max_inflight=8,
    )
    with _loader(store, fetch=fetch, shuffle=False) as loader:
        assert sum(len(lab) for _, lab in loader) == N_IMAGES
    stats = loader.stats()
    assert 0 < stats.hedges_sent <= 0.1 * stats.requests + 2
    # Hedges hold no in-flight slot, and are not counted in flight: the peak is the slots'.
    assert stats.inflight_peak <= stats.max_inflight == 8
    assert stats.request_p50 > 0 and stats.request_p99 >= stats.request_p90 >= stats.request_p50


def test_each_range_of_a_large_object_is_hedged_on_its_own() -> None:
    blob = hashlib.sha256(b"seed").digest() * 40_000  # 1.28 MB: 5 ranges of 256 KiB
    bucket = MemoryBucket({"big.bin": blob, **{f"small/{i}.bin": b"x" * 100 for i in range(40)}})
    store = FaultyStore(MemoryStore(bucket), stall_seconds=60)
    cfg = al.FetchConfig(
        range_threshold=256 << 10, part_size=256 << 10, hedge_min_samples=20, max_inflight=8
    )

    async def main() -> tuple[bytes, Counters]:
        counters = Counters()
        fetcher = Fetcher(store, counters, cfg)
        for i in range(40):  # latencies to learn the deadline from
            await fetcher.fetch(al.ObjectInfo(f"small/{i}.bin", 100))
        store.fail_next(1, "big.bin", kind="stall")  # one of the five ranges stalls
        data = await asyncio.wait_for(fetcher.fetch(al.ObjectInfo("big.bin", len(blob))), 20)
        return bytes(data), counters

    data, counters = asyncio.run(main())
    assert data == blob
    assert counters.hedges_sent == counters.hedges_won == 1


def test_a_tail_on_a_real_server_is_hedged(light_server: S3TestServer) -> None:
    light_server.set_faults({"stall": 0.05}, max_faults_per_key=1, stall_seconds=30, seed=2)
    t0 = time.monotonic()
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=16,
        transform=al.RandomResizedCrop(32),
        fetch=al.FetchConfig(hedge_min_samples=16, hedge_share=0.2),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": light_server.endpoint}),
    ) as loader:
        assert sum(len(lab) for _, lab in loader) == N_IMAGES
    stats = loader.stats()
    assert light_server.stats()["counters"]["fault_stall"] > 0
    assert stats.hedges_won > 0 and stats.hedges_sent <= 0.2 * stats.requests + 4
    assert time.monotonic() - t0 < 25  # no sample of the epoch waited for its 30 s stall


def test_batches_are_the_same_under_delays_throttling_and_hedges(bucket: MemoryBucket) -> None:
    # Answers come back in another order (stalls, throttles with their back-off, hedges
    # winning), the in-flight budget moves: the batches must not.
    def epoch_pixels(store: al.ObjectStore, **kw: object) -> tuple[np.ndarray, list[int]]:
        with _loader(store, seed=5, **kw) as loader:
            loader.set_epoch(2)
            batches = [(images.numpy().copy(), labels.tolist()) for images, labels in loader]
        return np.concatenate([b[0] for b in batches]), [x for b in batches for x in b[1]]

    clean = epoch_pixels(MemoryStore(bucket), fetch=al.FetchConfig(hedge=False, adaptive=False))
    store = FaultyStore(
        MemoryStore(bucket),
        rates={"stall": 0.15, "throttle": 0.15},
        stall_seconds=0.05,
        max_faults_per_key=2,
        seed=11,
    )
    fetch = al.FetchConfig(hedge_min_samples=8, hedge_floor=0.005, backoff_base=0.005)
    delayed = epoch_pixels(store, fetch=fetch)
    assert store.faults["stall"] > 0 and store.faults["throttle"] > 0
    assert delayed[1] == clean[1]
    assert np.array_equal(delayed[0], clean[0])


def test_a_late_request_gets_its_hedge_once_one_is_free(bucket: MemoryBucket) -> None:
    # One hedge in flight at most; two requests pass their deadline together.  The one that
    # finds the hedge taken must get its own as soon as that one is answered, not wait out
    # its stall.
    store = FaultyStore(MemoryStore(bucket), latency=0.002, stall_seconds=60)
    keys = bucket.sorted_keys()
    for key in keys[40:42]:
        store.fail_next(1, key, kind="stall")
    fetch = al.FetchConfig(
        hedge_min_samples=16, hedge_min_inflight=1, hedge_share=1.0, max_inflight=16
    )
    t0 = time.monotonic()
    with _loader(store, shuffle=False, fetch=fetch) as loader:
        assert sum(len(lab) for _, lab in loader) == N_IMAGES
    stats = loader.stats()
    assert store.faults["stall"] == 2
    assert stats.hedges_won == 2
    assert time.monotonic() - t0 < 30  # far less than one stall (60 s)


def test_a_hedge_that_failed_as_its_fetch_was_stopped_leaves_no_unretrieved_error(
    bucket: MemoryBucket,
) -> None:
    # The hedge fails (503) in the same turn of the loop in which its fetch is cancelled (a
    # loader closing, a batch stopped): its error must be taken, not left for the loop to
    # report as "Task exception was never retrieved" when the task is collected.
    keys = bucket.sorted_keys()

    class StallThenThrottle(MemoryStore):
        def __init__(self) -> None:
            super().__init__(bucket)
            self.outer: asyncio.Task[object] | None = None
            self.calls = 0

        async def get(
            self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
        ) -> bytes:
            if key != keys[-1]:
                return bytes(await super().get(key, start=start, end=end, etag=etag))
            self.calls += 1
            if self.calls == 1:
                await asyncio.sleep(60)  # the first request stalls: it gets a hedge
            assert self.outer is not None
            self.outer.cancel()  # the fetch is stopped as its hedge fails
            raise al.Throttled("503 SlowDown")

    store = StallThenThrottle()
    cfg = al.FetchConfig(hedge_min_samples=16, hedge_min_inflight=1, hedge_share=1.0)
    reported: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, ctx: reported.append(str(ctx.get("message"))))
        fetcher = Fetcher(store, Counters(), cfg)
        for key in keys[:20]:  # latencies to learn the deadline from
            await fetcher.fetch(al.ObjectInfo(key, UNSIZED))
        store.outer = asyncio.create_task(fetcher.fetch(al.ObjectInfo(keys[-1], UNSIZED)))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(store.outer, 20)
        del store.outer
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()  # a task's unretrieved error is reported when it is collected
        await asyncio.sleep(0)

    asyncio.run(main())
    assert store.calls == 2  # the request and its hedge
    assert not [m for m in reported if "never retrieved" in m], reported
