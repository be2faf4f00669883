"""The engine out of the training process (``EngineConfig(mode="process")``, the default):
the same batches whatever the number of engine processes, slots given back from the
trainer, counters summed over the engines, nothing left when the trainer is killed, and the
in-process mode by name or by fallback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import asyncloader as al
from asyncloader._decode import decode_holds_gil
from asyncloader.testing import S3TestServer, descendants

from ._shm import memfds, segments
from .conftest import N_IMAGES
from .test_pipeline import _epoch

BATCH = 8


@pytest.fixture(scope="module")
def server(jpeg_folder: Path) -> Iterator[S3TestServer]:
    with S3TestServer(load=jpeg_folder, bucket="b", prefix="train/", latency=0.002) as s:
        yield s


def _loader(server: S3TestServer, **kw: object) -> al.ImageLoader:
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("transform", al.RandomResizedCrop(24))
    return al.ImageLoader(
        "s3://b/train/",
        **kw,
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),  # type: ignore[arg-type]
    )


def _engine_pids() -> list[int]:
    """Engine processes below this one (their command line names the entry point)."""
    out = []
    for pid in descendants(os.getpid()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"engine_main" in cmd:
            out.append(pid)
    return out


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_same_batches_whatever_the_number_of_engines(
    server: S3TestServer, shuffle: bool
) -> None:
    runs = {}
    for engine in (
        al.EngineConfig(mode="inline"),
        al.EngineConfig(processes=1),
        al.EngineConfig(processes=2),
        al.EngineConfig(processes=3),
    ):
        with _loader(server, seed=4, shuffle=shuffle, engine=engine) as loader:
            assert loader.engine_processes == (engine.processes or 0)
            first = _epoch(loader)
            second = _epoch(loader)  # the next epoch, prefetched across the boundary
            loader.set_epoch(0)
            again = _epoch(loader)  # a restart: batches made before it are dropped
        runs[engine.processes] = (first, second)
        assert again[0] == first[0]
        assert np.array_equal(again[1], first[1])
    (labels, pixels), (labels2, pixels2) = runs[None]
    assert len(labels) == N_IMAGES
    for n in (1, 2, 3):
        (l1, p1), (l2, p2) = runs[n]
        assert l1 == labels
        assert l2 == labels2
        assert np.array_equal(p1, pixels)  # bit for bit
        assert np.array_equal(p2, pixels2)


def test_resume_mid_epoch_on_another_engine_count(server: S3TestServer) -> None:
    with _loader(server, seed=2, engine=al.EngineConfig(processes=3)) as loader:
        it = iter(loader)
        seen = [next(it)[1].tolist() for _ in range(5)]
        state = loader.state_dict()
        rest_expected = [lab.tolist() for _, lab in it]
    with _loader(server, seed=2, engine=al.EngineConfig(processes=2)) as again:
        again.load_state_dict(state)
        rest = [lab.tolist() for _, lab in again]
    assert rest == rest_expected
    assert sorted(x for b in seen + rest for x in b) == sorted(
        x for b in seen + rest_expected for x in b
    )


def test_slots_come_back_from_the_trainer(server: S3TestServer) -> None:
    # Two slots per engine: the engines make the whole epoch only if every batch the
    # trainer lets go (in this thread, in another, held a while) frees its slot there.
    engine = al.EngineConfig(processes=2, prefetch_batches=4)
    with _loader(server, engine=engine) as loader:
        kept: list[object] = []
        dropper = []
        n = 0
        for images, labels in loader:
            n += len(labels)
            kept.append((images, labels))
            if len(kept) > 1:  # the previous batch, dropped by another thread
                old = kept.pop(0)
                t = threading.Thread(target=lambda b=[old]: b.clear())
                del old
                t.start()
                dropper.append(t)
        for t in dropper:
            t.join()
        assert n == N_IMAGES
        assert loader.stats().ring_slots == 4
        kept.clear()
        # Holding every slot of the engine whose turn it is is the usual clear error.
        batches = []
        with pytest.raises(al.BatchesHeldError):
            for batch in loader:
                batches.append(batch)


def test_stats_are_summed_over_the_engines(server: S3TestServer) -> None:
    counts = {}
    for n in (1, 3):
        with _loader(server, shuffle=False, engine=al.EngineConfig(processes=n)) as loader:
            _epoch(loader)
            stats = loader.stats()
        counts[n] = stats
        assert stats.batches == -(-N_IMAGES // BATCH)
        assert stats.samples == N_IMAGES
        assert stats.decoded >= N_IMAGES  # and perhaps the next epoch's first batches
        assert stats.objects_fetched >= N_IMAGES
        assert stats.requests >= stats.objects_fetched
        assert stats.objects_listed == N_IMAGES
        assert stats.request_p50 > 0
    # Three engines, three rings (two slots each at the least).
    assert counts[3].ring_slots > counts[1].ring_slots


def test_the_inline_mode_runs_no_engine_process(server: S3TestServer) -> None:
    with _loader(server, engine=al.EngineConfig(mode="inline")) as loader:
        assert loader.engine_processes == 0
        next(iter(loader))
        assert _engine_pids() == []
    with _loader(server, engine=al.EngineConfig(processes=2)) as loader:
        next(iter(loader))
        pids = _engine_pids()
        assert len(pids) == 2
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []


def _size_hook(data: bytes) -> np.ndarray:
    return np.full((1, 2, 2), len(data) % 251, np.uint8)


def test_a_decode_that_holds_the_gil_gets_an_engine_per_decode_worker(
    server: S3TestServer,
) -> None:
    """A decode hook (Python) holds the GIL: the loader runs one engine process per decode
    worker, each decoding on one thread, and each engine has no child process."""
    hook = al.DecodeConfig(workers=3, hook=_size_hook, sample_shape=(1, 2, 2))
    with _loader(server, shuffle=False, decode=hook, transform=None) as loader:
        assert loader.engine_processes == 3
        images, _ = next(iter(loader))
        sizes = [s.obj.size % 251 for s in loader.dataset.samples[:BATCH]]
        assert images[:, 0, 0, 0].tolist() == sizes
        pids = _engine_pids()
        assert len(pids) == 3
        assert set(descendants(os.getpid())) >= set(pids)
        for pid in pids:
            assert descendants(pid) == []
        assert loader.stats().decode_workers == 3
    # The built-in decode holds it for almost nothing (its extensions built): one engine
    # feeds 4 decode threads.
    with _loader(server, decode=al.DecodeConfig(workers=3)) as loader:
        assert loader.engine_processes == (3 if decode_holds_gil(decode_hook=False) else 1)


def test_the_process_decode_backend_names_its_replacement() -> None:
    with pytest.raises(ValueError, match="decode_backend='process' is gone") as err:
        al.DecodeConfig(backend="process")  # type: ignore[arg-type]
    assert "engine process per decode worker" in str(err.value)
    assert "EngineConfig(processes=N)" in str(err.value)
    assert _engine_pids() == []


def test_a_hook_that_cannot_be_pickled_runs_inline_with_one_warning(
    server: S3TestServer,
) -> None:
    with pytest.warns(RuntimeWarning, match="cannot be sent to an engine process"):
        loader = _loader(server, labels=lambda key: len(key), shuffle=False)
    with loader:
        assert loader.engine_processes == 0
        _, labels = next(iter(loader))
        keys = [s.obj.key for s in loader.dataset.samples[:BATCH]]
    assert labels.tolist() == [len(k) for k in keys]


def test_an_error_while_starting_is_raised_by_the_constructor(server: S3TestServer) -> None:
    with pytest.raises(al.AsyncLoaderError, match="no samples under s3://b/nothing-here/"):
        al.ImageLoader(
            "s3://b/nothing-here/",
            store=al.StoreConfig(options={"endpoint_url": server.endpoint}),
        )
    assert _engine_pids() == []


KILLED = textwrap.dedent(
    """
    import sys, time, numpy as np, asyncloader as al
    def hook(data):  # Python: holds the GIL, so the loader runs an engine per decode worker
        return np.full((1, 2, 2), len(data) % 251, np.uint8)
    if __name__ == "__main__":
        if sys.argv[2] == "hook":
            decode = al.DecodeConfig(workers=2, hook=hook, sample_shape=(1, 2, 2))
            engine = None  # the default: an engine per decode worker
        else:
            decode = al.DecodeConfig(workers=2)
            engine = al.EngineConfig(processes=2)
        store = al.StoreConfig(options={"endpoint_url": sys.argv[1]})
        loader = al.ImageLoader("s3://b/train/", batch_size=4, shuffle=False, decode=decode,
                                engine=engine, store=store)
        for epoch in range(1000):
            for i, _ in enumerate(loader):
                if epoch == 0 and i == 1:
                    print("STREAMING", flush=True)
                time.sleep(0.05)
    """
)


@pytest.mark.parametrize("decode", ["jpeg", "hook"])
def test_engines_die_with_a_killed_trainer(
    server: S3TestServer, tmp_path: Path, decode: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(KILLED)
    proc = subprocess.Popen(
        [sys.executable, str(script), server.endpoint, decode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "STREAMING"
        below = descendants(proc.pid)
        engines = [p for p in below if b"engine_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(engines) == 2
        # Two levels of processes, never three: an engine has no child process, whatever
        # the decode (a GIL-bound hook gets more engines, not decode processes below them).
        assert set(below) == set(engines)
        # Each maps its ring (the trainer's): a memfd, which goes with the last process that
        # holds it; none in /dev/shm.
        for pid in engines:
            assert len(memfds(pid)) == 1
        assert segments([proc.pid, *below]) == set()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not [p for p in below if _alive(p)]:
                break
            time.sleep(0.1)
        assert [p for p in below if _alive(p)] == []
        assert segments([proc.pid, *below]) == set()
    finally:
        proc.kill()
        proc.communicate()  # reaped, its pipe closed


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan is reaped by init, but not at once)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_how_an_engine_ended_in_words() -> None:
    from asyncloader._loader._launch import how_it_ended

    assert how_it_ended(1) == "exited with code 1"
    assert how_it_ended(-signal.SIGBUS).startswith("was killed by SIGBUS: a write into shared")
    assert how_it_ended(-signal.SIGTERM) == "was killed by SIGTERM: asked to stop from outside"
    assert how_it_ended(-200) == "was killed by signal 200"


QUIET = textwrap.dedent(
    """
    import sys, asyncloader as al
    if __name__ == "__main__":
        for url in ("s3://b/nothing-here/", "s3://no-such-bucket/train/"):
            try:
                al.ImageLoader(url, decode=al.DecodeConfig(workers=8),
                               store=al.StoreConfig(options={"endpoint_url": sys.argv[1]}))
            except al.AsyncLoaderError as exc:
                print("ERROR", type(exc).__name__, flush=True)
    """
)


def test_a_start_up_failure_of_several_engines_is_one_error_and_nothing_else(
    server: S3TestServer, tmp_path: Path
) -> None:
    # Two engines: the lead's listing fails, the other engine waits for its dataset and is
    # stopped; it leaves without a word (it printed a TypeError traceback before).
    script = tmp_path / "start.py"
    script.write_text(QUIET)
    out = subprocess.run(
        [sys.executable, str(script), server.endpoint],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split("\n")[:2] == ["ERROR AsyncLoaderError", "ERROR ObjectNotFound"], out
    assert "Traceback" not in out.stderr, out.stderr


def test_rings_live_in_dev_shm_where_there_is_no_memfd(
    server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncloader._base._shm as shm

    with _loader(server, seed=1, engine=al.EngineConfig(processes=2)) as loader:
        expected = _epoch(loader)
        assert segments([os.getpid()]) == set()  # memfds
    monkeypatch.setattr(shm, "USE_MEMFD", False)  # as on macOS
    with _loader(server, seed=1, engine=al.EngineConfig(processes=2)) as loader:
        assert len(segments([os.getpid()])) == 2  # the trainer made both engines' rings
        got = _epoch(loader)
    assert got[0] == expected[0]
    assert np.array_equal(got[1], expected[1])
    assert segments([os.getpid()]) == set()


def test_a_small_dataset_is_not_fetched_epochs_ahead(server: S3TestServer) -> None:
    # 96 images in batches of 32: three batches an epoch, two from engine 0, one from
    # engine 1.  Each engine uses no more ring slots than it makes batches an epoch (two at
    # the least): one epoch read fetches that epoch and at most four batches ahead, not
    # the rings' worth of epochs.
    with _loader(server, batch_size=32, engine=al.EngineConfig(processes=2)) as loader:
        assert sum(len(lab) for _, lab in loader) == N_IMAGES
        time.sleep(0.5)  # the engines fill what they may meanwhile
        stats = loader.stats()
    assert stats.ring_slots >= 6  # the rings are larger than an epoch
    assert N_IMAGES <= stats.objects_fetched <= N_IMAGES + 4 * 32
    assert stats.samples_ahead == stats.decoded - N_IMAGES
    assert f"{stats.samples_ahead} more decoded ahead of the training loop" in stats.summary()
