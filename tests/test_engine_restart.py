"""A dead engine process is replaced where it stopped (``EngineConfig.max_restarts``): the
epoch goes on with every sample once, in the seed's order, bit for bit; the batches it made
stay readable; what it left (its segments, its decode workers) is gone; one death too many
in an epoch raises, naming how the engine ended."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncloader as al
from asyncloader._base import _lifecycle as life
from asyncloader.testing import S3TestServer, descendants

from ._shm import memfds, segments
from .conftest import N_IMAGES
from .test_engines import _alive, _engine_pids, _loader
from .test_pipeline import _epoch

ENGINE = al.EngineConfig(processes=2, prefetch_batches=4)  # two slots each: little run-ahead


@pytest.fixture(scope="module")
def server(jpeg_folder: Path) -> Iterator[S3TestServer]:
    with S3TestServer(load=jpeg_folder, bucket="b", prefix="train/", latency=0.002) as s:
        yield s


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _size_hook(data: bytes) -> np.ndarray:
    """A decode hook in Python (it holds the GIL): a pixel of the object's size."""
    return np.full((1, 4, 4), len(data) % 251, np.uint8)


HOOK = {
    "decode": al.DecodeConfig(workers=2, hook=_size_hook, sample_shape=(1, 4, 4)),
    "transform": None,
}


@pytest.mark.parametrize(
    ("decode", "kill_after"),
    [("jpeg", 2), ("hook", 2), ("jpeg", 12)],
    ids=["jpeg-mid-epoch", "hook-mid-epoch", "jpeg-at-the-epoch-end"],
)
def test_a_killed_engine_is_replaced_and_the_epoch_is_exact(
    server: S3TestServer, decode: str, kill_after: int
) -> None:
    kw: dict[str, Any] = HOOK if decode == "hook" else {}
    inline = al.EngineConfig(mode="inline")
    with _loader(server, seed=5, engine=inline, **kw) as reference:
        expected = [_epoch(reference), _epoch(reference)]
    # Rings an earlier test's batches may still map in this process (freed when they are).
    earlier = memfds(os.getpid())
    with _loader(server, seed=5, engine=ENGINE, **kw) as loader:
        it = iter(loader)
        kept: list[tuple[Any, list[int]]] = []
        for i in range(kill_after):
            images, lab = next(it)
            # Batch 1 is engine 1's: held across its death, read from its old ring after.
            kept.append((images if i == 1 else images.numpy().copy(), lab.tolist()))
        engines = _engine_pids()
        victim = engines[1]
        assert descendants(victim) == []  # an engine has no child process
        os.kill(victim, signal.SIGKILL)
        kept += [(images.numpy().copy(), lab.tolist()) for images, lab in it]
        labels = [x for _, lab in kept for x in lab]
        pixels = np.concatenate([np.asarray(im) for im, _ in kept])
        assert labels == expected[0][0]
        assert np.array_equal(pixels, expected[0][1])  # every sample once, in order, bit for bit
        second = _epoch(loader)
        assert second[0] == expected[1][0]
        assert np.array_equal(second[1], expected[1][1])
        stats = loader.stats()
        assert stats.engine_restarts == 1
        assert stats.samples == 2 * len(expected[0][0])
        assert "engine restarts 1" in stats.summary()
        # Nothing of the dead engine is left: not it, not its segments.
        assert _gone_within([victim], 30) == []
        now = _engine_pids()
        assert len(now) == 2 and victim not in now
        # The dead engine's ring stays mapped here while a batch of it is held; then the
        # memory goes (the memfd with its last mapping), and nothing is in /dev/shm.
        rings = memfds(os.getpid())
        del kept, images, lab
        assert len(memfds(os.getpid())) == len(rings) - 1
    assert segments([os.getpid(), *engines, *now]) == set()
    assert memfds(os.getpid()) <= earlier  # every ring of this loader, the dead one's too
    assert [p for p in now if _alive(p)] == []


@pytest.mark.slow
def test_a_death_beyond_the_bound_raises_and_is_named_truly(server: S3TestServer) -> None:
    engine = al.EngineConfig(processes=2, prefetch_batches=4, max_restarts=1)
    with _loader(server, shuffle=False, engine=engine) as loader:
        it = iter(loader)
        next(it)
        first = _engine_pids()[1]
        os.kill(first, signal.SIGKILL)
        while loader.stats().engine_restarts == 0:
            next(it)
        (second,) = set(_engine_pids()) - set(_engine_pids()[:1]) - {first}
        time.sleep(1.5)  # its memory is looked at once a second
        os.kill(second, signal.SIGKILL)
        with pytest.raises(al.PipelineDeadError) as info:
            for _ in it:
                pass
    message = str(info.value)
    assert f"pid {second}" in message
    assert "killed by SIGKILL, often by the out-of-memory killer" in message
    assert "MB when last seen" in message
    assert "engine processes replaced in epoch 0 so far: 1" in message
    assert "max_restarts=1" in message
    assert "__main__" not in message  # the script's guard has nothing to do with it


def test_stats_do_not_wait_for_an_engine_that_died(
    server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between an engine's death and its replacement (once the trainer has taken what it
    sent), ``stats()`` answers without waiting for the dead engine's reply, which cannot
    come (the wait for a reply, ``COUNTERS_REPLY``, is a minute here): the dead engine
    counts what it last sent, so no total goes back; then the epoch goes on, every
    sample once."""
    monkeypatch.setattr(life, "COUNTERS_REPLY", 60.0)
    engine = al.EngineConfig(processes=2, prefetch_batches=4, max_restarts=1)
    with _loader(server, shuffle=False, engine=engine) as loader:
        it = iter(loader)
        seen = len(next(it)[1])
        before = loader.stats()
        victim = _engine_pids()[1]
        os.kill(victim, signal.SIGKILL)
        assert _gone_within([victim], 10) == []
        t0 = time.monotonic()
        after = loader.stats()
        assert time.monotonic() - t0 < 30, "stats() waited for the dead engine's reply"
        assert after.engine_restarts == 0  # not replaced yet: the path under test
        for name in ("decoded", "objects_fetched", "requests", "bytes_fetched"):
            assert getattr(after, name) >= getattr(before, name), name
        seen += sum(len(labels) for _, labels in it)
        assert loader.stats().engine_restarts == 1
    assert seen == N_IMAGES


def test_with_no_restarts_the_first_death_raises(server: S3TestServer) -> None:
    engine = al.EngineConfig(processes=2, max_restarts=0)
    with _loader(server, shuffle=False, engine=engine) as loader:
        it = iter(loader)
        next(it)
        victim = _engine_pids()[1]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(al.PipelineDeadError) as info:
            for _ in it:
                pass
            for _ in range(20):  # epochs: the dead engine's batches made before run out
                for _ in loader:
                    pass
        assert loader.stats().engine_restarts == 0
    message = str(info.value)
    assert f"pid {victim}" in message
    assert "killed by SIGKILL, often by the out-of-memory killer" in message
    assert "replaced" not in message


def test_max_restarts_is_checked() -> None:
    with pytest.raises(ValueError, match="max_restarts must be at least 0"):
        al.EngineConfig(max_restarts=-1)
