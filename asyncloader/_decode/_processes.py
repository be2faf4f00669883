"""Decode in worker processes that write into the ring's shared memory: the parent side
(launch, dispatch, restart, shutdown).  The child side is :mod:`._worker`.

A worker that dies is seen as EOF on its socket by the event loop, replaced, and its jobs are
retried once.  Workers live as long as the loader, across epochs.  Fetched bytes reach them
through a shared-memory arena (:mod:`._arena`), not the socket, when an extent is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import multiprocessing.connection as mpc
import pickle
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._base import _lifecycle as life
from .._base._child import how_it_ended, launch, stop_children
from .._base._errors import AsyncLoaderError, DecodeError, PipelineDeadError, shown_key
from .._base._shm import SegmentRef
from .._base._types import DecodeJob, Outcome
from .._base._wire import ChildFailed, Message, Stop
from ._arena import Arena
from ._image import DecodeSpec
from ._worker import Jobs, Results, WorkerOrder, WorkerReady

__all__ = ["ProcessDecodePool"]

_RETRY = -1  # the priority of a dead worker's jobs: lower than any batch's


def _launch(
    spec_bytes: bytes,
    ring: SegmentRef,
    shape: tuple[int, ...],
    arena: SegmentRef | None,
) -> _Worker:
    """Start one decode process; its first message tells it what to do (the segments'
    descriptors it inherits)."""
    order = WorkerOrder(spec_bytes, ring, shape, arena)
    fds = ring.fds + (arena.fds if arena is not None else ())
    proc, conn = launch(_ENTRY, "asyncloader-decode", order, pass_fds=fds)
    return _Worker(proc, conn)


_ENTRY = "asyncloader._decode._worker:worker_main"
_DIED_STARTING = (
    "a decode worker {how} before it was ready; what it printed is on stderr. "
    "decode_backend='thread' decodes without processes."
)


_QUIT = object()  # ends a worker's sender thread without a message to the worker


@dataclass
class _Worker:
    """A decode process, its connection, and the jobs it holds.

    Messages to it go through ``outbox`` and a sender thread of its own: a chunk of fetched
    objects is larger than the socket's buffer, and a blocking send on the event loop would
    stall every fetch until the worker had finished its current jobs and read it.
    """

    proc: subprocess.Popen[bytes]
    conn: mpc.Connection
    jobs: dict[int, DecodeJob] = field(default_factory=dict)  # sent, not answered
    ready: bool = False
    outbox: queue.SimpleQueue[Message | object] = field(default_factory=queue.SimpleQueue)
    sender: threading.Thread | None = None

    def start_sender(self, on_broken: Callable[[], None]) -> None:
        def run() -> None:
            while True:
                msg = self.outbox.get()
                if msg is _QUIT:
                    return
                try:
                    self.conn.send(msg)
                except (OSError, ValueError):  # the worker is gone
                    on_broken()
                    return
                if isinstance(msg, Stop):  # the worker was told to stop
                    return

        self.sender = threading.Thread(target=run, name="asyncloader-decode-send", daemon=True)
        self.sender.start()

    def join(self, timeout: float) -> int | None:
        """The exit code, waiting up to ``timeout`` seconds; None while it still runs."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(timeout, 0))
        return self.proc.returncode

    def stop_sender(self, timeout: float = life.WORKER_STEP) -> None:
        self.outbox.put(_QUIT)
        if self.sender is not None:
            self.sender.join(timeout)


class ProcessDecodePool:
    """Decode in worker processes that write into the ring's shared memory.

    Args:
        workers: Number of processes.
        spec: Decode settings (sent once per worker).
        ring: The ring's segment.
        shape: Shape of the ring's image array (slots, batch, C, H, W).
        depth: Jobs outstanding per worker (keeps a worker busy while results travel).
        start_timeout: How long workers may take to start [seconds].
        arena_bytes: Size of the shared-memory arena fetched bytes travel through (0: the
            socket only); its pages reserved when made [bytes].
        tracked: A POSIX arena is registered with this process's resource tracker (as the
            ring is; see :meth:`Segment.new <asyncloader._base._shm.Segment.new>`).

    Workers are fresh interpreters (``python -c``, as safe with threads around as ``spawn``)
    that import this module, not the user's script: see :func:`._worker.worker_main`.
    """

    def __init__(
        self,
        workers: int,
        spec: DecodeSpec,
        ring: SegmentRef,
        shape: tuple[int, ...],
        *,
        depth: int = 4,
        start_timeout: float = life.WORKER_START,
        arena_bytes: int = 64 << 20,
        tracked: bool = True,
    ) -> None:
        self.workers = workers
        self.restarts = 0
        self._ring = ring
        self._shape = shape
        self._depth = depth
        self._start_timeout = start_timeout
        self._spec_bytes = pickle.dumps(spec)
        self._pool: list[_Worker] = []
        # (priority, job id, job), lowest first: the pipeline's batch order, then arrival.
        self._pending: list[tuple[int, int, DecodeJob]] = []
        self._futures: dict[int, asyncio.Future[Outcome]] = {}
        self._attempts: dict[int, int] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._broken: PipelineDeadError | None = None
        self._arena_bytes = arena_bytes
        self._tracked = tracked
        self._arena: Arena | None = None

    @property
    def arena_jobs(self) -> int:
        """Jobs whose bytes went through the arena."""
        return self._arena.jobs if self._arena is not None else 0

    def _release(self, job: DecodeJob) -> None:
        """The job is answered (or given up): its extent is free again."""
        if self._arena is not None:
            self._arena.release(job)

    def _close_arena(self) -> None:
        arena, self._arena = self._arena, None
        if arena is not None:
            arena.close()

    def _spawn(self) -> _Worker:
        """Launch one worker with its sender thread (blocking: runs off the loop)."""
        arena = self._arena.ref if self._arena is not None else None
        w = _launch(self._spec_bytes, self._ring, self._shape, arena)
        w.start_sender(lambda: self._broken_pipe(w))
        return w

    def _watch(self, w: _Worker) -> None:
        assert self._loop is not None
        self._loop.add_reader(w.conn.fileno(), self._on_readable, w)

    def _broken_pipe(self, w: _Worker) -> None:
        """From a sender thread: the worker cannot be written to (it died)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_death, w)

    async def start(self) -> None:
        """Start the workers and wait until each is ready; results are then read on the
        running loop.  Launching and waiting run in a helper thread, never on the loop.

        Raises:
            PipelineDeadError: a worker died or stayed silent while starting.
        """
        self._loop = asyncio.get_running_loop()
        if self._arena_bytes > 0 and self._arena is None:
            try:
                self._arena = Arena(self._arena_bytes, tracked=self._tracked)
            except AsyncLoaderError:  # no room in /dev/shm: the bytes go through the socket
                self._arena = None
        try:
            self._pool = await asyncio.to_thread(self._start_all, self._start_timeout)
        except BaseException:
            self._close_arena()
            raise
        for w in self._pool:
            self._watch(w)

    def _start_all(self, timeout: float) -> list[_Worker]:
        pool = [self._spawn() for _ in range(self.workers)]
        deadline = time.monotonic() + timeout
        for w in pool:
            try:
                if not w.conn.poll(max(deadline - time.monotonic(), 0)):
                    _stop_workers(pool)
                    raise PipelineDeadError(f"decode worker did not start within {timeout} s")
                msg = w.conn.recv()
            except (EOFError, OSError):
                code = w.join(life.CHILD_EXIT)
                self._closed = True
                _stop_workers(pool)
                raise PipelineDeadError(_DIED_STARTING.format(how=how_it_ended(code))) from None
            if not isinstance(msg, WorkerReady):
                self._closed = True
                _stop_workers(pool)
                if isinstance(msg, ChildFailed):
                    raise msg.error.rebuild()
                raise PipelineDeadError(f"decode worker sent {msg!r} instead of being ready")
            w.ready = True
        return pool

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._pool]

    async def decode(self, job: DecodeJob, priority: int = 0) -> Outcome:
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise PipelineDeadError("decode pool is closed")
        assert self._loop is not None
        job_id = self._next_id
        self._next_id += 1
        fut: asyncio.Future[Outcome] = self._loop.create_future()
        self._futures[job_id] = fut
        heapq.heappush(self._pending, (priority, job_id, job))
        self._dispatch()
        try:
            return await fut
        finally:
            self._futures.pop(job_id, None)
            self._attempts.pop(job_id, None)

    async def decode_many(
        self, jobs: Sequence[DecodeJob], priority: int = 0
    ) -> list[Outcome | BaseException]:
        """Each job as its own :meth:`decode` (results already travel in chunks here)."""
        results = await asyncio.gather(
            *(self.decode(job, priority) for job in jobs), return_exceptions=True
        )
        return list(results)

    async def drain(self, limit: float = life.WORKER_DRAIN) -> None:
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
            ids: list[int] = []
            jobs: list[DecodeJob] = []
            while self._pending and len(ids) < room:
                _, job_id, job = heapq.heappop(self._pending)
                fut = self._futures.get(job_id)
                if fut is None or fut.done():
                    self._release(job)
                    continue  # cancelled while queued
                job = self._arena.put(job) if self._arena is not None else job
                ids.append(job_id)
                jobs.append(job)
                w.jobs[job_id] = job
            if ids:
                w.outbox.put(Jobs(tuple(ids), tuple(jobs)))

    def _on_readable(self, w: _Worker) -> None:
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if isinstance(msg, Results):
                    self._results(w, msg)
                elif isinstance(msg, ChildFailed):
                    self._fail_worker(w, msg.error.rebuild())
                    return
                elif isinstance(msg, WorkerReady):
                    w.ready = True  # a replacement, started while the pool ran
                else:
                    raise TypeError(f"decode worker sent {msg!r}")
        except (EOFError, OSError):
            self._on_death(w)
            return
        except Exception as exc:  # a message that cannot be read: the worker is replaced
            error = PipelineDeadError(f"a message from a decode worker could not be read: {exc!r}")
            error.__cause__ = exc
            self._fail_worker(w, error)
            return
        self._dispatch()

    def _results(self, w: _Worker, msg: Results) -> None:
        for job_id, outcome in zip(msg.ids, msg.outcomes, strict=True):
            done = w.jobs.pop(job_id, None)
            if done is not None:
                self._release(done)
            fut = self._futures.get(job_id)
            if fut is not None and not fut.done():
                if isinstance(outcome, Outcome):
                    fut.set_result(outcome)
                else:
                    fut.set_exception(outcome.rebuild())

    def _fail_worker(self, w: _Worker, error: BaseException) -> None:
        """On the loop: ``w`` cannot go on.  Its jobs fail with ``error`` (not retried: the
        cause is not the input's death of a worker), and it is stopped and replaced."""
        for job_id, job in list(w.jobs.items()):
            self._release(job)
            fut = self._futures.get(job_id)
            if fut is not None and not fut.done():
                fut.set_exception(error)
        w.jobs.clear()
        with contextlib.suppress(OSError):
            w.proc.kill()
        self._on_death(w)

    def _on_death(self, w: _Worker) -> None:
        """On the loop: ``w`` died.  Its jobs go back to the queue (or fail, the second
        time); reaping it and starting a replacement happen in a helper thread."""
        if self._closed or w not in self._pool:
            return
        assert self._loop is not None
        self._loop.remove_reader(w.conn.fileno())
        self._pool.remove(w)
        self._retry_jobs_of(w)
        fut = self._loop.run_in_executor(None, self._reap_and_replace, w)
        fut.add_done_callback(lambda f: self._replaced(w, f))
        self._dispatch()

    def _reap_and_replace(self, w: _Worker) -> tuple[int | None, _Worker | None]:
        """In a helper thread: the dead worker's exit code, and its replacement (None when
        it died before it was ready: a replacement would die again)."""
        w.stop_sender()  # a send to a dead worker fails at once
        w.conn.close()
        code = w.join(life.CHILD_EXIT)
        if not w.ready or self._closed:
            return code, None
        return code, self._spawn()

    def _replaced(
        self, dead: _Worker, done: asyncio.Future[tuple[int | None, _Worker | None]]
    ) -> None:
        """On the loop, once :meth:`_reap_and_replace` is done."""
        if done.cancelled():
            return
        exc = done.exception()
        code, new = done.result() if exc is None else (None, None)
        if new is not None and self._closed:
            _stop_workers([new])  # closed meanwhile: rare, and the join is short
            return
        if new is not None:
            self._pool.append(new)
            self._watch(new)
            self.restarts += 1
            self._dispatch()
            return
        if self._closed:
            return
        # Died before it was ready, or could not be replaced: stop, don't loop.
        self._broken = PipelineDeadError(
            _DIED_STARTING.format(how=how_it_ended(code))
            if exc is None
            else f"a decode worker {how_it_ended(code)} and could not be replaced: {exc!r}"
        )
        if exc is not None:
            self._broken.__cause__ = exc
        self._closed = True
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(self._broken)

    def _retry_jobs_of(self, w: _Worker) -> None:
        # Retry the dead worker's jobs once; a job that kills two workers is the input's fault.
        code = w.proc.poll()
        how = "killed by a signal" if code is not None and code < 0 else f"exit code {code}"
        for job_id, job in w.jobs.items():
            pending = self._futures.get(job_id)
            if pending is None or pending.done():
                continue
            tries = self._attempts.get(job_id, 0) + 1
            self._attempts[job_id] = tries
            if tries >= 2:
                self._release(job)
                pending.set_exception(
                    DecodeError(
                        f"decode worker died ({how}) twice decoding {shown_key(job.key)}",
                        key=job.key,
                    )
                )
            else:
                heapq.heappush(self._pending, (_RETRY, job_id, job))  # before any other

    async def aclose(self) -> None:
        """Stop the workers: ask, then terminate, then kill (each step waits up to
        ``WORKER_STEP``), in a helper thread; on the loop only the bookkeeping."""
        self._closed = True
        pool, self._pool = self._pool, []
        if self._loop is not None and not self._loop.is_closed():
            for w in pool:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(w.conn.fileno())
        for fut in self._futures.values():
            if not fut.done():
                fut.cancel()
        try:
            await asyncio.to_thread(_stop_workers, pool)
        except RuntimeError:
            # Interpreter exit: no new threads may start any more; block here instead.
            _stop_workers(pool)
        self._close_arena()  # no worker reads it any more


def _stop_workers(pool: Sequence[_Worker]) -> None:
    """Ask every worker to stop, then terminate, then kill the ones still running (each
    step waits up to ``WORKER_STEP``); blocking, so never on the loop."""
    for w in pool:
        w.outbox.put(Stop())  # through the sender thread: one writer per connection
    stop_children([w.proc for w in pool], life.WORKER_STEP, life.WORKER_STEP)
    for w in pool:
        w.stop_sender()
        w.conn.close()
