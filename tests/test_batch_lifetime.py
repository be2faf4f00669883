"""A batch stays intact for as long as the consumer references it: its ring slot (or the
uploader's output buffer) is reused only once the last tensor or view of it is gone."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections import deque
from pathlib import Path

import pytest
import torch

import asyncloader as al
from asyncloader._base._lifecycle import HELD_GRACE
from asyncloader._device._ring import BatchRing
from asyncloader.testing import S3TestServer

from ._shm import memfds, segments
from .conftest import N_IMAGES

BATCH = 4


@pytest.fixture(scope="module")
def slow_server(jpeg_folder: Path) -> object:
    """The light S3 server at 5 ms: batches keep arriving while the consumer holds one."""
    with S3TestServer(load=jpeg_folder, bucket="b", prefix="train/", latency=0.005) as server:
        yield server


def _loader(server: S3TestServer, **kw: object) -> al.ImageLoader:
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("transform", al.CenterCrop(32))
    kw.setdefault("shuffle", False)
    return al.ImageLoader(
        "s3://b/train/", **kw, store=al.StoreConfig(options={"endpoint_url": server.endpoint})
    )  # type: ignore[arg-type]


def _ring_segments() -> set[int]:
    """The rings this process maps (memfds the trainer makes for its engine processes): a
    mapping stays until the last batch of it goes, and the memory with it."""
    return memfds(os.getpid())


def _shm_names() -> set[str]:
    """POSIX segments this process made (none where rings are memfds)."""
    return segments([os.getpid()])


CASES = [
    pytest.param({}, id="one-engine"),
    pytest.param({"engine": al.EngineConfig(processes=2)}, id="two-engines"),
    pytest.param({"device": "cpu", "dtype": "uint8"}, id="cpu"),
]


@pytest.mark.parametrize("options", CASES)
def test_first_batch_inspected_later_is_unchanged(
    slow_server: S3TestServer, options: dict[str, object]
) -> None:
    # The first thing people do with a loader: look at one batch, a little later again.
    with _loader(slow_server, **options) as loader:
        images, labels = next(iter(loader))
        first = images[:, 0, 0, 0].tolist()
        copy, label_copy = images.clone(), labels.clone()
        time.sleep(0.5)  # the loader fills every other slot meanwhile
        assert images[:, 0, 0, 0].tolist() == first
        column = images[:, 0]  # a view keeps the batch as well as the tensor does
        del images
        # A whole epoch more through the other slots, several times round the ring.
        assert sum(len(lab) for _, lab in loader) == N_IMAGES
        assert torch.equal(column, copy[:, 0]) and torch.equal(labels, label_copy)


@pytest.mark.parametrize("options", CASES)
def test_last_k_batches_stay_intact_while_iterating(
    slow_server: S3TestServer, options: dict[str, object]
) -> None:
    k = 3
    kept: deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = deque()
    seen = 0
    given = options.get("engine") or al.EngineConfig()
    engine = dataclasses.replace(given, prefetch_batches=k + 3)  # type: ignore[type-var]
    options = {**options, "engine": engine}
    with _loader(slow_server, **options) as loader:
        for images, labels in loader:
            kept.append((images, labels, images.clone(), labels.clone()))
            if len(kept) > k:
                kept.popleft()
            for img, lab, img_copy, lab_copy in kept:
                assert torch.equal(img, img_copy) and torch.equal(lab, lab_copy)
            seen += len(labels)
            time.sleep(0.01)  # the loader runs ahead meanwhile
        assert seen == N_IMAGES
        assert loader.stats().ring_held <= k + 1


def test_zip_of_two_loaders_and_one_batch_ahead(slow_server: S3TestServer) -> None:
    # Two loaders in lock step, each pair kept across one more step: all intact.
    with _loader(slow_server) as a, _loader(slow_server, shuffle=True) as b:
        previous = None
        for pair in zip(a, b, strict=True):
            copies = [t.clone() for batch in pair for t in batch]
            time.sleep(0.05)  # the loaders run ahead meanwhile
            if previous is not None:
                old, old_copies = previous
                assert all(
                    torch.equal(t, c)
                    for t, c in zip((t for batch in old for t in batch), old_copies, strict=True)
                )
            previous = (pair, copies)


def test_batch_kept_after_close_stays_readable_and_memory_goes_with_it(
    slow_server: S3TestServer,
) -> None:
    before = _ring_segments()
    loader = _loader(slow_server)
    images, labels = next(iter(loader))
    copy = images.clone()
    segment = _ring_segments() - before
    assert len(segment) == 1
    loader.close()
    # The loader is gone, the batch is not: same pixels, and its memory is still there.
    assert torch.equal(images, copy)
    assert _ring_segments() - before == segment
    as_numpy = images.numpy()
    del images, labels
    gc.collect()
    assert _ring_segments() - before == segment  # the numpy view still holds it
    assert (as_numpy == copy.numpy()).all()
    del as_numpy
    assert _ring_segments() - before == set()
    assert _shm_names() == set()


@pytest.mark.parametrize("options", CASES)
def test_one_iteration_at_a_time_the_newest_goes_on(
    slow_server: S3TestServer, jpeg_folder: Path, options: dict[str, object]
) -> None:
    """A loader is one stream of batches. A peek (``next(iter(loader))``) then a loop: the
    loop has the whole epoch. A second iteration started while one is in use (a peek
    inside the loop, nested loops, another thread): the newer goes on with the whole
    epoch, and the older, asked for its next batch, says it was superseded (after the
    batches it had taken already, if any: an uploader's, taken ahead) — never a batch
    the newer one has (silently repeated or lost samples)."""
    keys = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    index = {k: i for i, k in enumerate(keys)}
    with _loader(slow_server, labels=index.__getitem__, **options) as loader:
        first = next(iter(loader))[1].tolist()
        labels = [x for _, batch in loader for x in batch.tolist()]
        assert labels == list(range(N_IMAGES)) and labels[:BATCH] == first
        outer = iter(loader)
        seen = [x for _ in range(3) for x in next(outer)[1].tolist()]
        assert seen == labels[: 3 * BATCH]
        inner = iter(loader)
        again = [x for _, batch in inner for x in batch.tolist()]
        assert again == labels  # the whole epoch, from its start
        rest: list[int] = []
        with pytest.raises(al.AsyncLoaderError, match="superseded by a newer iteration"):
            for _ in range(N_IMAGES):  # bounded: it raises within a few batches
                rest += next(outer)[1].tolist()
        # What it had taken: an uploader's batches ahead (its queue of 2, and the one it
        # waits to put there), the old stream's next ones.
        assert rest == labels[3 * BATCH : 3 * BATCH + len(rest)] and len(rest) <= 3 * BATCH
        assert [x for _, batch in loader for x in batch.tolist()] == labels  # as before


@pytest.mark.parametrize("shape", [None, (4, 4)], ids=["square", "bucketed"])
def test_a_closed_ring_hands_out_no_batch(shape: tuple[int, int] | None) -> None:
    """A loader closed from another thread while a batch was on its way: the consumer's
    next lease is the loader's ClosedError, before the ring's memory is gone and after,
    never a read of freed memory; a batch held from before stays whole."""
    ring = BatchRing(2, 4, (3, 8, 8), shared=True)
    ring.images[0] = 7
    images, labels = ring.lease(0, 2, shape)
    ring.close()
    with pytest.raises(al.ClosedError, match="the loader is closed"):
        ring.lease(1, 2, shape)  # the segment still mapped: the held batch keeps it
    assert (images == 7).all() and len(labels) == 2
    del images, labels
    gc.collect()
    assert ring.held == 0
    with pytest.raises(al.ClosedError, match="the loader is closed"):
        ring.lease(1, 2, shape)  # the segment gone


def test_closing_with_no_batch_held_unlinks_at_once(slow_server: S3TestServer) -> None:
    before = _ring_segments()
    with _loader(slow_server) as loader:
        assert sum(len(labels) for _, labels in loader) == N_IMAGES  # none kept
        segment = _ring_segments() - before
        assert len(segment) == 1
    assert _ring_segments() - before == set()
    assert _shm_names() == set()


def test_holding_every_slot_is_a_clear_error(slow_server: S3TestServer) -> None:
    with _loader(slow_server, engine=al.EngineConfig(prefetch_batches=3)) as loader:
        it = iter(loader)
        held = [next(it) for _ in range(3)]
        assert loader.stats().ring_held == 3
        t0 = time.monotonic()
        with pytest.raises(al.BatchesHeldError) as info:
            next(it)
        waited = time.monotonic() - t0
        assert HELD_GRACE <= waited < HELD_GRACE + 5
        message = str(info.value)
        assert "clone()" in message and "prefetch_batches" in message and "3" in message
        # Letting go of one batch lets the loader go on, from the start of the epoch.
        held.pop()
        assert len(next(iter(loader))[1]) == BATCH


def test_cpu_outputs_held_beyond_the_pool(slow_server: S3TestServer) -> None:
    # device="cpu" batches are made in reused buffers; holding more of them than the pool
    # keeps costs memory (new buffers), never other pixels.
    with _loader(slow_server, device="cpu", dtype="float32") as loader:
        kept = [(images, images.clone()) for images, _ in loader]
        assert len(kept) == -(-N_IMAGES // BATCH)
        for images, copy in kept:
            assert torch.equal(images, copy)
        assert loader.stats().ring_held == 0  # the uploader let go of every slot
