"""Decode workers: bytes in, pixels written straight into a batch slot.

Two pools with one async interface (``await pool.decode(...)`` → busy seconds):

* :class:`ThreadDecodePool` — threads.  Pillow releases the GIL while it decodes and
  resizes, so on few cores threads match or beat processes, with no pipe traffic at all.
* :class:`ProcessDecodePool` — worker processes attached to the ring's shared memory.  Only
  the object bytes and a few numbers travel to a worker, and only the busy time (or a
  picklable error) comes back; pixels are never pickled.  A worker that dies is seen as EOF
  on its pipe by the event loop, replaced, and its jobs are retried once.

Workers live as long as the loader, across epochs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import multiprocessing.connection as mpc
import multiprocessing.process as mp_process
import multiprocessing.spawn as mp_spawn
import pickle
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from PIL import Image

from ._errors import DecodeError, PipelineDeadError, shown_key
from ._transforms import Transform
from ._types import Blob, BlobCache, CachedAt, DecodeFn

__all__ = [
    "DAMAGED",
    "HIT",
    "MISS",
    "STORED",
    "STORE_FAILED",
    "DecodePool",
    "DecodeSpec",
    "Outcome",
    "ProcessDecodePool",
    "ThreadDecodePool",
    "decode_into",
    "run_job",
]

U8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """What every decode needs besides the bytes; sent to each worker once.

    Attributes:
        sample_shape: (C, H, W) of one output sample.
        transform: Geometry planner, or None with a ``decode_fn``.
        decode_fn: A hook turning bytes into a uint8 array of ``sample_shape``.
        max_pixels: Refuse sources with more pixels (decompression bombs).
        cache: The SSD cache workers read hits from and store fetched bytes into.
    """

    sample_shape: tuple[int, int, int]
    transform: Transform | None = None
    decode_fn: DecodeFn | None = None
    max_pixels: int = 89_478_485
    cache: BlobCache | None = None


def decode_into(data: Blob, out: U8Array, spec: DecodeSpec, seed: int, key: str) -> None:
    """Decode ``data`` into ``out`` (a CHW uint8 view of a batch slot).

    Raises:
        DecodeError: corrupt or truncated data, a decompression bomb, a hook that returned
            the wrong shape; the message names ``key``.
    """
    if spec.decode_fn is not None:
        what = shown_key(key)
        try:
            arr = np.asarray(spec.decode_fn(data))
        except Exception as exc:
            raise DecodeError(f"decode hook failed on {what}: {exc!r}", key=key) from exc
        if arr.shape != out.shape or arr.dtype != np.uint8:
            raise DecodeError(
                f"decode hook returned {arr.dtype}{list(arr.shape)} for {what}, "
                f"expected uint8{list(out.shape)}",
                key=key,
            )
        out[...] = arr
        return
    assert spec.transform is not None
    try:
        img: Image.Image = Image.open(io.BytesIO(data))
        width, height = img.size
        if width * height > spec.max_pixels:
            raise DecodeError(
                f"{shown_key(key)} is {width}x{height} pixels, over "
                f"max_pixels={spec.max_pixels} "
                "(decompression bomb?)",
                key=key,
            )
        plan = spec.transform.plan(width, height, random.Random(seed))
        left, top, right, bottom = plan.box
        out_w, out_h = plan.size
        if img.format == "JPEG":
            # Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the crop is at least twice
            # the output: it skips most of the IDCT work.  draft() picks the largest scale
            # that keeps the crop at least as large as the output.
            want = (
                math.ceil(width * out_w / max(right - left, 1)),
                math.ceil(height * out_h / max(bottom - top, 1)),
            )
            if want[0] * 2 <= width and want[1] * 2 <= height:
                img.draft("RGB", want)
                sx, sy = img.size[0] / width, img.size[1] / height
                left, top, right, bottom = left * sx, top * sy, right * sx, bottom * sy
        if img.mode != "RGB":
            img = img.convert("RGB")
        img = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=(left, top, right, bottom))
        arr = np.asarray(img)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(
            f"cannot decode {shown_key(key)}: {type(exc).__name__}: {exc}", key=key
        ) from exc
    if plan.flip:
        arr = arr[:, ::-1]
    # One strided copy HWC → CHW into shared memory; numpy releases the GIL for it.
    np.copyto(out, arr.transpose(2, 0, 1))


# Flags of a job's outcome, besides its busy time.
HIT = 1  # the bytes came from the cache
MISS = 2  # not in the cache (or damaged): nothing decoded, the loop must fetch
STORED = 4  # fetched bytes were written to the cache
STORE_FAILED = 8  # writing to the cache failed (disk full, ...): counted, not fatal
DAMAGED = 16  # a damaged cache entry was found and dropped

Outcome = tuple[float, int]  # (busy seconds, flags)


def run_job(
    data: Blob | CachedAt | None,
    out: U8Array,
    spec: DecodeSpec,
    seed: int,
    key: str,
    cache_key: str,
    size: int,
) -> Outcome:
    """One decode job as workers run it: cache read or write-back, then decode into ``out``.

    ``data=None`` means "look in the cache", a :class:`CachedAt` "read the cache at this
    file" (found by the batch's one index query): a miss returns ``MISS`` without decoding.
    Fetched bytes (``data`` given) are stored under ``cache_key`` before decoding: they were
    verified against the listed length and ETag, and a corrupt image then fails the same
    way from the cache, without another download.
    """
    t0 = time.perf_counter()
    flags = 0
    cache = spec.cache if cache_key else None
    if data is None or isinstance(data, CachedAt):
        assert cache is not None
        data = cache.get(cache_key, size) if data is None else cache.read(cache_key, size, data)
        if cache.take_damaged():
            flags |= DAMAGED
        if data is None:
            return time.perf_counter() - t0, flags | MISS
        flags |= HIT
    elif cache is not None:
        try:
            cache.put(cache_key, data)
            flags |= STORED
        except Exception:  # a full or broken disk must not stop training
            flags |= STORE_FAILED
    decode_into(data, out, spec, seed, key)
    return time.perf_counter() - t0, flags


class DecodePool(Protocol):
    """Runs :func:`run_job` for one sample into ``slot``/``index`` of the ring."""

    workers: int
    restarts: int

    async def decode(
        self,
        data: Blob | CachedAt | None,
        slot: int,
        index: int,
        seed: int,
        key: str,
        cache_key: str = "",
        size: int = -1,
    ) -> Outcome: ...

    async def decode_many(self, jobs: Sequence[Job]) -> list[Outcome | BaseException]:
        """Several :meth:`decode` jobs awaited as one (per-job result or exception)."""
        ...

    def close(self) -> None: ...


Job = tuple[Blob | CachedAt | None, int, int, int, str, str, int]
"""The arguments of one :meth:`DecodePool.decode`: (data, slot, index, seed, key, cache_key,
size)."""


class _Group:
    """Jobs awaited together: one future, resolved when the last of them completes."""

    __slots__ = ("fut", "remaining", "results")

    def __init__(self, fut: asyncio.Future[list[Outcome | BaseException]], n: int) -> None:
        self.fut = fut
        self.remaining = n
        self.results: list[Outcome | BaseException] = [(0.0, 0)] * n


# Completions that may wait for one wake-up of the loop while more jobs are queued: fewer
# self-pipe writes and GIL hand-offs (measured: about 6 % less CPU per image than waking for
# each completion on 2 cores; 32 was no better than 8).
_WAKE_EVERY = 8


class ThreadDecodePool:
    """Decode in threads, straight into the ring's arrays.

    Jobs go to the threads through a plain queue; results come back through a deque, and the
    event loop is woken only when no wake-up is already pending — and, while more jobs are
    queued, only once a few completions have gathered.  One wake-up serves many samples:
    fewer self-pipe writes, loop iterations and GIL hand-offs than one ``run_in_executor``
    future per sample.
    """

    def __init__(self, workers: int, spec: DecodeSpec, images: U8Array) -> None:
        self.workers = workers
        self.restarts = 0
        self._spec = spec
        self._images = images
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._done: deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._active = 0  # jobs queued or running; decode threads may write into slots
        self._idle = threading.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = [
            threading.Thread(target=self._work, name=f"asyncloader-decode-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    async def decode(
        self,
        data: Blob | CachedAt | None,
        slot: int,
        index: int,
        seed: int,
        key: str,
        cache_key: str = "",
        size: int = -1,
    ) -> Outcome:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = self._loop.create_future()
        with self._lock:
            self._active += 1
            self._idle.clear()
        self._jobs.put((fut, data, slot, index, seed, key, cache_key, size))
        return await fut

    async def decode_many(self, jobs: Sequence[Job]) -> list[Outcome | BaseException]:
        """The jobs of a batch as one group: one future and one wake-up for all of them
        (cache hits of a whole batch cost the loop almost nothing per sample)."""
        if not jobs:
            return []
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        group = _Group(self._loop.create_future(), len(jobs))
        with self._lock:
            self._active += len(jobs)
            self._idle.clear()
        for i, job in enumerate(jobs):
            self._jobs.put((group, i, *job))
        return await group.fut

    def _work(self) -> None:
        images, spec = self._images, self._spec
        while True:
            job = self._jobs.get()
            if job is None:
                return
            target = job[0]
            if isinstance(target, _Group):
                index_in_group = job[1]
                data, slot, index, seed, key, cache_key, size = job[2:]
                fut: Any = target.fut
            else:
                fut, data, slot, index, seed, key, cache_key, size = job
            outcome: Outcome = (0.0, 0)
            err: BaseException | None = None
            if not fut.cancelled():  # racy but harmless: a late cancel just wastes one decode
                try:
                    outcome = run_job(data, images[slot, index], spec, seed, key, cache_key, size)
                except BaseException as exc:  # handed to the awaiting task
                    err = exc
            del job, data
            if isinstance(target, _Group):
                target.results[index_in_group] = err if err is not None else outcome
                with self._lock:
                    target.remaining -= 1
                    last = target.remaining == 0
                if last:
                    self._done.append((fut, target.results, None))
            else:
                self._done.append((fut, outcome, err))
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._idle.set()
                # Wake the loop for the first completion since the last wake-up, unless
                # more jobs are queued (another completion follows soon) and few are
                # waiting: one wake-up then delivers several samples.
                wake = not self._wake_pending and (
                    len(self._done) >= _WAKE_EVERY or self._jobs.empty()
                )
                if wake:
                    self._wake_pending = True
            if wake and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                    self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            self._wake_pending = False
        done = self._done
        while done:
            fut, outcome, err = done.popleft()
            if fut.done():
                continue
            if err is None:
                fut.set_result(outcome)
            else:
                fut.set_exception(err)

    async def drain(self) -> None:
        """Wait until no job is queued or running: only then can slots be reused."""
        await asyncio.to_thread(self._idle.wait)

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
        self._deliver()


# --- process pool ----------------------------------------------------------------------------


def _worker_entry(fd: int) -> None:
    """Entry point of a decode process, started as ``python -c`` with its socket as ``fd``.

    The first message carries what the process needs: multiprocessing's preparation data
    (working directory, argv; sys.path is set on the command line), the pickled
    :class:`DecodeSpec`, and the ring's name and shape.  The parent's ``__main__`` (the
    user's training script, which usually imports torch and more) is imported only when the
    spec needs it, e.g. a ``decode_fn`` defined there: a plain worker starts with numpy and
    Pillow alone.
    """
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = mpc.Connection(fd)
    try:
        prep, main, spec_bytes, shm_name, shape = conn.recv()
    except (EOFError, OSError):
        return
    mp_spawn.prepare(prep)
    try:
        spec = pickle.loads(spec_bytes)
    except (AttributeError, ImportError):
        if not main:
            raise
        # The spec refers to the user's script: import it, as spawn does, and like spawn
        # refuse to start processes from it meanwhile (an unguarded script that creates a
        # loader fails with multiprocessing's clear error instead of starting workers again).
        mp_process.current_process()._inheriting = True  # type: ignore[attr-defined]
        try:
            mp_spawn.prepare(main)
        finally:
            del mp_process.current_process()._inheriting  # type: ignore[attr-defined]
        spec = pickle.loads(spec_bytes)
    _serve(conn, spec, shm_name, shape)


def _attach(name: str) -> SharedMemory:
    """The parent's segment, not registered with a resource tracker of this process.

    The parent owns and unlinks the segment. Python < 3.13 registers every attach, and a
    tracker of the worker's own would unlink the ring when the worker exits.
    """
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)  # type: ignore[call-arg,unused-ignore]
    from multiprocessing import resource_tracker

    register = resource_tracker.register
    resource_tracker.register = lambda *args: None  # type: ignore[assignment]
    try:
        return SharedMemory(name=name)
    finally:
        resource_tracker.register = register


def _serve(conn: mpc.Connection, spec: DecodeSpec, shm_name: str, shape: tuple[int, ...]) -> None:
    shm = _attach(shm_name)
    images: U8Array = np.ndarray(shape, np.uint8, buffer=shm.buf)
    try:
        conn.send(_READY)
        while True:
            msg = conn.recv()
            if msg is None:
                return
            for job_id, slot, index, seed, key, data, cache_key, size in msg:
                try:
                    outcome = run_job(data, images[slot, index], spec, seed, key, cache_key, size)
                    reply: tuple[Any, ...] = (job_id, outcome, None)
                except Exception as exc:
                    err = exc if isinstance(exc, DecodeError) else DecodeError(repr(exc), key=key)
                    err.add_note("in a decode worker:\n" + traceback.format_exc())
                    reply = (job_id, (0.0, 0), err)
                conn.send(reply)
    except (EOFError, OSError):
        return  # the parent is gone
    finally:
        del images
        with contextlib.suppress(Exception):
            shm.close()


def _launch(
    prep: dict[str, Any], spec_bytes: bytes, shm_name: str, shape: tuple[int, ...]
) -> _Worker:
    """Start one decode process on a socket pair; the first message tells it what to do."""
    parent_sock, child_sock = socket.socketpair()
    # The parent's sys.path before anything is imported (spawn sets it only afterwards): the
    # worker imports this very package, wherever the parent found it.
    path = [p for p in sys.path if isinstance(p, str)]
    fd = child_sock.fileno()
    code = f"import sys; sys.path[:] = {path!r}; {_ENTRY}({fd})"
    try:
        proc = subprocess.Popen(
            [mp_spawn.get_executable(), "-c", code],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the parent decides when workers stop, Ctrl-C or not
        )
    finally:
        child_sock.close()
    conn = mpc.Connection(parent_sock.detach())
    main = {k: prep[k] for k in ("init_main_from_name", "init_main_from_path") if k in prep}
    bare = {k: prep[k] for k in ("sys_argv", "dir", "orig_dir") if k in prep}  # path: above
    conn.send((bare, main, spec_bytes, shm_name, shape))
    return _Worker(proc, conn)


_ENTRY = "from asyncloader._decode import _worker_entry; _worker_entry"
_READY = "ready"
_DIED_STARTING = (
    "decode worker could not start (exit code {code}); its error is on stderr. A decode= "
    "hook defined in the training script makes workers import the script: guard its entry "
    "point with `if __name__ == '__main__':`. decode_backend='thread' decodes without "
    "processes."
)


_STOP = "stop"  # ends a worker's sender thread without a message to the worker


@dataclass
class _Worker:
    """A decode process, its connection, and the jobs it holds.

    Messages to it go through ``outbox`` and a sender thread of its own: a chunk of fetched
    objects is larger than the socket's buffer, and a blocking send on the event loop would
    stall every fetch until the worker had finished its current jobs and read it.
    """

    proc: subprocess.Popen[bytes]
    conn: mpc.Connection
    jobs: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    ready: bool = False
    outbox: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    sender: threading.Thread | None = None

    def start_sender(self, on_broken: Callable[[], None]) -> None:
        def run() -> None:
            while True:
                msg = self.outbox.get()
                if msg is _STOP:
                    return
                try:
                    self.conn.send(msg)
                except (OSError, ValueError):  # the worker is gone
                    on_broken()
                    return
                if msg is None:  # the worker was told to stop
                    return

        self.sender = threading.Thread(target=run, name="asyncloader-decode-send", daemon=True)
        self.sender.start()

    def join(self, timeout: float) -> int | None:
        """The exit code, waiting up to ``timeout`` seconds; None while it still runs."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(timeout, 0))
        return self.proc.returncode

    def stop_sender(self, timeout: float = 2.0) -> None:
        self.outbox.put(_STOP)
        if self.sender is not None:
            self.sender.join(timeout)


class ProcessDecodePool:
    """Decode in worker processes that write into the ring's shared memory.

    Args:
        workers: Number of processes.
        spec: Decode settings (sent once per worker).
        shm_name: Name of the ring's shared-memory segment.
        shape: Shape of the ring's image array (slots, batch, C, H, W).
        depth: Jobs outstanding per worker (keeps a worker busy while results travel).

    Workers are fresh interpreters (``python -c``, as safe with threads around as ``spawn``)
    that import this module, not the user's script: see :func:`_worker_entry`.
    """

    def __init__(
        self,
        workers: int,
        spec: DecodeSpec,
        shm_name: str,
        shape: tuple[int, ...],
        *,
        depth: int = 4,
    ) -> None:
        self.workers = workers
        self.restarts = 0
        self._shm_name = shm_name
        self._shape = shape
        self._depth = depth
        self._spec_bytes = pickle.dumps(spec)
        self._prep = mp_spawn.get_preparation_data("asyncloader-decode")
        self._pool: list[_Worker] = []
        self._pending: deque[tuple[Any, ...]] = deque()
        self._futures: dict[int, asyncio.Future[Outcome]] = {}
        self._attempts: dict[int, int] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._broken: PipelineDeadError | None = None

    def _spawn(self) -> _Worker:
        w = _launch(self._prep, self._spec_bytes, self._shm_name, self._shape)
        w.start_sender(lambda: self._broken_pipe(w))
        if self._loop is not None:
            self._loop.add_reader(w.conn.fileno(), self._on_readable, w)
        return w

    def _broken_pipe(self, w: _Worker) -> None:
        """From a sender thread: the worker cannot be written to (it died)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_death, w)

    def start(self, loop: asyncio.AbstractEventLoop, timeout: float = 60.0) -> None:
        """Start the workers and wait until each is ready; results are read on ``loop``.

        Raises:
            PipelineDeadError: a worker died or stayed silent while starting.
        """
        self._pool = [self._spawn() for _ in range(self.workers)]
        deadline = time.monotonic() + timeout
        for w in self._pool:
            try:
                if not w.conn.poll(max(deadline - time.monotonic(), 0)):
                    raise PipelineDeadError(f"decode worker did not start within {timeout} s")
                w.conn.recv()
                w.ready = True
            except (EOFError, OSError):
                code = w.join(5)
                self._closed = True
                self.close_workers()
                raise PipelineDeadError(_DIED_STARTING.format(code=code)) from None
        self._loop = loop
        for w in self._pool:
            loop.add_reader(w.conn.fileno(), self._on_readable, w)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._pool]

    async def decode(
        self,
        data: Blob | CachedAt | None,
        slot: int,
        index: int,
        seed: int,
        key: str,
        cache_key: str = "",
        size: int = -1,
    ) -> Outcome:
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise PipelineDeadError("decode pool is closed")
        assert self._loop is not None
        job_id = self._next_id
        self._next_id += 1
        fut: asyncio.Future[Outcome] = self._loop.create_future()
        self._futures[job_id] = fut
        self._pending.append((job_id, slot, index, seed, key, data, cache_key, size))
        self._dispatch()
        try:
            return await fut
        finally:
            self._futures.pop(job_id, None)
            self._attempts.pop(job_id, None)

    async def decode_many(self, jobs: Sequence[Job]) -> list[Outcome | BaseException]:
        """Each job as its own :meth:`decode` (results already travel in chunks here)."""
        results = await asyncio.gather(*(self.decode(*job) for job in jobs), return_exceptions=True)
        return list(results)

    async def drain(self, limit: float = 30.0) -> None:
        """Wait until workers have finished every job sent to them (they write into slots).

        Results arrive through ``_on_readable`` on this loop; a short poll is simpler than
        an event that every result would have to check, and drain only runs on restarts.
        """
        deadline = time.monotonic() + limit
        while any(w.jobs for w in self._pool) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.002)

    def _dispatch(self) -> None:
        # Fill the least loaded workers up to `depth`, several jobs per message.
        while self._pending and self._pool:
            w = min(self._pool, key=lambda w: len(w.jobs))
            room = self._depth - len(w.jobs)
            if room <= 0:
                return
            chunk: list[tuple[Any, ...]] = []
            while self._pending and len(chunk) < room:
                job = self._pending.popleft()
                fut = self._futures.get(job[0])
                if fut is None or fut.done():
                    continue  # cancelled while queued
                chunk.append(job)
                w.jobs[job[0]] = job
            if chunk:
                w.outbox.put(chunk)

    def _on_readable(self, w: _Worker) -> None:
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg == _READY:
                    w.ready = True
                    continue
                job_id, outcome, err = msg
                w.jobs.pop(job_id, None)
                fut = self._futures.get(job_id)
                if fut is not None and not fut.done():
                    if err is None:
                        fut.set_result(outcome)
                    else:
                        fut.set_exception(err)
        except (EOFError, OSError):
            self._on_death(w)
            return
        self._dispatch()

    def _on_death(self, w: _Worker) -> None:
        if self._closed or w not in self._pool:
            return
        assert self._loop is not None
        self._loop.remove_reader(w.conn.fileno())
        w.stop_sender()  # a send to a dead worker fails at once
        w.conn.close()
        code = w.join(1)
        if not w.ready:
            # A replacement that dies before it is ready would die again: stop, don't loop.
            self._broken = PipelineDeadError(_DIED_STARTING.format(code=code))
            self._closed = True
            for fut in self._futures.values():
                if not fut.done():
                    fut.set_exception(self._broken)
            return
        self._pool[self._pool.index(w)] = self._spawn()
        self.restarts += 1
        # Retry the dead worker's jobs once; a job that kills two workers is the input's fault.
        for job_id, job in w.jobs.items():
            pending = self._futures.get(job_id)
            if pending is None or pending.done():
                continue
            tries = self._attempts.get(job_id, 0) + 1
            self._attempts[job_id] = tries
            if tries >= 2:
                pending.set_exception(
                    DecodeError(
                        f"decode worker died (exit code {code}) twice decoding {shown_key(job[4])}",
                        key=job[4],
                    )
                )
            else:
                self._pending.appendleft(job)
        self._dispatch()

    def close(self) -> None:
        """Stop workers: ask, then terminate, then kill (each step waits up to 2 s)."""
        self._closed = True
        self.close_workers()
        for fut in self._futures.values():
            if not fut.done():
                fut.cancel()

    def close_workers(self) -> None:
        pool, self._pool = self._pool, []
        for w in pool:
            if self._loop is not None and not self._loop.is_closed():
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(w.conn.fileno())
            w.outbox.put(None)  # through the sender thread: one writer per connection
        deadline = time.monotonic() + 2
        for w in pool:
            w.join(deadline - time.monotonic())
        for w in pool:
            if w.proc.poll() is None:
                w.proc.terminate()
                w.join(2)
            if w.proc.poll() is None:
                w.proc.kill()
                w.join(2)
            w.stop_sender()
            w.conn.close()
