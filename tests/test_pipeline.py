"""The pipeline's logic on the in-memory store (no server): order and coverage, failures and
their budget, resume, and faults injected at the store protocol."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncloader as al
from asyncloader._base._types import Blob, CachedAt
from asyncloader._cache import ObjectCache
from asyncloader.testing import FaultyStore, MemoryBucket, MemoryStore

from .conftest import N_CLASSES, N_IMAGES

BATCH = 16


@pytest.fixture(scope="module")
def bucket(jpeg_folder: Path) -> MemoryBucket:
    return MemoryBucket(
        {p.relative_to(jpeg_folder).as_posix(): p.read_bytes() for p in jpeg_folder.rglob("*.jpg")}
    )


def _loader(store: al.ObjectStore, **kw: object) -> al.ImageLoader:
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("transform", al.RandomResizedCrop(32))
    return al.ImageLoader(**kw, store=al.StoreConfig(object_store=store))  # type: ignore[arg-type]


def _epoch(loader: al.ImageLoader) -> tuple[list[int], np.ndarray]:
    labels, pixels = [], []
    for images, lab in loader:
        labels += lab.tolist()
        pixels.append(images.numpy().copy())
    return labels, np.concatenate(pixels)


def test_every_sample_once_in_the_same_order_for_the_same_seed(bucket: MemoryBucket) -> None:
    keys = bucket.sorted_keys()
    index = {k: i for i, k in enumerate(keys)}
    with _loader(MemoryStore(bucket), labels=index.__getitem__, seed=3) as loader:
        assert len(loader) == -(-N_IMAGES // BATCH)
        first, pixels = _epoch(loader)
        second, _ = _epoch(loader)
    assert sorted(first) == sorted(second) == list(range(N_IMAGES))
    assert first != second  # a new permutation per epoch
    # Another loader, other worker count and backend: the same batches, pixel for pixel.
    with _loader(
        MemoryStore(bucket),
        labels=index.__getitem__,
        seed=3,
        decode=al.DecodeConfig(workers=1),
    ) as again:
        assert _epoch(again)[0] == first
        again.set_epoch(0)
        assert np.array_equal(_epoch(again)[1], pixels)


def test_unshuffled_folder_labels(bucket: MemoryBucket) -> None:
    with _loader(MemoryStore(bucket), shuffle=False) as loader:
        labels, _ = _epoch(loader)
        assert loader.classes == tuple(f"class_{i:02d}" for i in range(N_CLASSES))
    assert labels == sorted(labels)


def test_skips_are_counted_and_the_budget_stops_the_run(bucket: MemoryBucket) -> None:
    broken = MemoryBucket({k: bucket.get(k)[0] for k in bucket.sorted_keys()})  # type: ignore[index]
    bad = broken.sorted_keys()[5:8]
    for key in bad:
        broken.put(key, b"\xff\xd8 not a JPEG")
    with _loader(
        MemoryStore(broken),
        errors=al.ErrorConfig(on_error="skip", max_failures=3),
    ) as loader:
        labels, _ = _epoch(loader)
        stats = loader.stats()
    assert len(labels) == N_IMAGES - 3
    assert stats.skipped == {"DecodeError": 3}
    with _loader(
        MemoryStore(broken),
        errors=al.ErrorConfig(on_error="skip", max_failures=2),
    ) as loader:
        with pytest.raises(al.FailureBudgetExceeded) as info:
            _epoch(loader)
    failures = info.value.exceptions
    assert len(failures) == 3 and all(isinstance(e, al.DecodeError) for e in failures)
    notes = "\n".join(n for e in failures for n in getattr(e, "__notes__", []))
    assert all(f"stage=decode key={k}" in notes for k in bad)
    with _loader(
        MemoryStore(broken),
        errors=al.ErrorConfig(on_error="raise"),
    ) as loader:
        with pytest.raises(al.DecodeError):
            _epoch(loader)


def test_missing_object_is_a_clear_error_or_a_counted_skip(
    bucket: MemoryBucket, tmp_path: Path
) -> None:
    # A manifest naming an object the store does not have.
    keys = [*bucket.sorted_keys(), "class_00/gone.jpg"]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps({"key": k, "label": 0}) for k in keys))
    with _loader(
        MemoryStore(bucket),
        labels=str(manifest),
        errors=al.ErrorConfig(on_error="skip", max_failures=1),
    ) as ld:
        assert sum(len(lab) for _, lab in ld) == N_IMAGES
        assert ld.stats().skipped == {"ObjectNotFound": 1}
    with _loader(MemoryStore(bucket), labels=str(manifest)) as ld:
        with pytest.raises(al.ObjectNotFound, match=r"class_00/gone\.jpg"):
            _epoch(ld)


def test_resume_mid_epoch_continues_with_the_next_batch(bucket: MemoryBucket) -> None:
    with _loader(MemoryStore(bucket), seed=5) as loader:
        loader.set_epoch(2)
        full, _ = _epoch(loader)
    with _loader(MemoryStore(bucket), seed=5) as loader:
        loader.set_epoch(2)
        it = iter(loader)
        head = [label for _ in range(2) for label in next(it)[1].tolist()]
        state = loader.state_dict()
    assert state["epoch"] == 2 and state["next_batch"] == 2
    with _loader(MemoryStore(bucket), seed=5) as loader:
        loader.load_state_dict(state)
        tail, _ = _epoch(loader)
        assert loader.epoch == 3
    assert head + tail == full


def test_transient_faults_are_retried_and_nothing_is_lost(bucket: MemoryBucket) -> None:
    with _loader(MemoryStore(bucket), seed=1) as loader:
        clean = _epoch(loader)
    store = FaultyStore(MemoryStore(bucket), rates={"throttle": 0.2, "error": 0.2}, seed=4)
    # No hedges: each injected fault is then exactly one retry.
    fetch = al.FetchConfig(backoff_base=0.001, max_attempts=10, hedge=False)
    with _loader(store, seed=1, fetch=fetch) as loader:
        faulty = _epoch(loader)
    stats = loader.stats()  # closed: no request of the next epoch is still in flight
    assert faulty[0] == clean[0] and np.array_equal(faulty[1], clean[1])
    assert store.faults["throttle"] > 0 and store.faults["error"] > 0
    assert stats.retries == {
        "throttled": store.faults["throttle"],
        "transient": store.faults["error"],
    }
    assert stats.skipped == {}


def test_an_answer_cut_short_is_asked_for_again(bucket: MemoryBucket) -> None:
    # A body shorter than listed, that the store itself did not notice, never becomes
    # pixels: the fetcher's length check sees it and asks again; only a length that stays
    # wrong is a failure.
    store = FaultyStore(MemoryStore(bucket))
    victim, stubborn = bucket.sorted_keys()[3], bucket.sorted_keys()[7]
    store.fail_next(1, victim, kind="truncate")
    fetch = al.FetchConfig(max_attempts=3, backoff_base=0.001, hedge=False)
    with _loader(store, shuffle=False, fetch=fetch) as loader:
        labels, _ = _epoch(loader)
    assert len(labels) == N_IMAGES
    assert loader.stats().retries == {"short": 1} and loader.stats().skipped == {}
    store = FaultyStore(MemoryStore(bucket))  # the loader closed the last one
    # Cut short on every attempt: three faults would not do, the stream fetches the key
    # again for the next epoch meanwhile and that fetch would take some of them.
    store.fail_next(10**6, stubborn, kind="truncate")
    with _loader(
        store,
        shuffle=False,
        fetch=fetch,
        errors=al.ErrorConfig(on_error="skip", max_failures=1),
    ) as loader:
        labels, _ = _epoch(loader)
        assert loader.stats().skipped == {"LengthMismatch": 1}
    assert len(labels) == N_IMAGES - 1


def test_a_stalled_request_is_reported_by_the_timeout(bucket: MemoryBucket) -> None:
    store = FaultyStore(MemoryStore(bucket), stall_seconds=30)
    store.fail_next(1, bucket.sorted_keys()[0], kind="stall")
    no_hedges = al.FetchConfig(hedge=False)  # a hedge would answer in its place
    with _loader(store, shuffle=False, timeout=1.0, fetch=no_hedges) as loader:
        t0 = time.monotonic()
        with pytest.raises(al.AsyncLoaderError, match=r"no batch from mem://memory/ within 1\.0 s"):
            next(iter(loader))
        assert time.monotonic() - t0 < 10


def test_a_late_sample_does_not_stop_the_batches_after_it(bucket: MemoryBucket) -> None:
    # The first sample of batch 0 never answers (no hedging here).  Every other slot of
    # the ring fills meanwhile; nothing is announced out of order.
    store = FaultyStore(MemoryStore(bucket), stall_seconds=120)
    store.fail_next(1, bucket.sorted_keys()[0], kind="stall")
    fetch = al.FetchConfig(hedge=False)
    t0 = time.monotonic()
    with _loader(
        store, shuffle=False, fetch=fetch, engine=al.EngineConfig(prefetch_batches=4)
    ) as loader:
        expected = 4 * BATCH - 1  # batch 0 but its late sample, and batches 1, 2, 3
        deadline = time.monotonic() + 60
        while loader.stats().decoded < expected and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = loader.stats()
        assert stats.decoded == expected
        assert stats.batches_produced == 0  # batch 0 is first, whatever finished before it
        assert store.faults["stall"] == 1
    assert time.monotonic() - t0 < 60  # closing does not wait for the stalled answer


def test_with_a_cache_batches_fetch_in_their_order(
    bucket: MemoryBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch asks the cache's index which of its samples are cached, then fetches the
    rest.  The answers come in batch order: a slow answer for one batch never lets a later
    batch's requests go ahead of it."""
    keys = bucket.sorted_keys()
    index = {k: i for i, k in enumerate(keys)}
    requested: list[str] = []

    class Recording(MemoryStore):
        async def get(self, key: str, **kw: Any) -> Blob:
            requested.append(key)
            return await super().get(key, **kw)

    locate = ObjectCache.locate
    calls = itertools.count()

    def slow_first(self: ObjectCache, keys: Sequence[str]) -> dict[str, CachedAt | None]:
        if next(calls) == 0:  # the first batch's query
            time.sleep(0.3)
        return locate(self, keys)

    monkeypatch.setattr(ObjectCache, "locate", slow_first)
    store = Recording(bucket)
    with _loader(store, labels=index.__getitem__, seed=3, cache_dir=tmp_path / "c") as loader:
        batches = [labels.tolist() for _, labels in loader]
    batch_of = {keys[label]: b for b, labels in enumerate(batches) for label in labels}
    order = [batch_of[k] for k in dict.fromkeys(requested)]  # first requests, epoch 0 first
    assert order[: len(keys)] == sorted(order[: len(keys)])
    assert order[0] == 0
