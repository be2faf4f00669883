"""Decode in threads of the training process, straight into the ring's arrays.

Pillow releases the GIL while it decodes and resizes, so on few cores threads match or beat
processes, with no pipe traffic at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import queue
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from .._base._types import DecodeJob, Outcome
from ._image import DecodeSpec, U8Array
from ._job import run_job

__all__ = ["ThreadDecodePool"]


class _Group:
    """Jobs awaited together: one future, resolved when the last of them completes."""

    __slots__ = ("fut", "remaining", "results")

    def __init__(self, fut: asyncio.Future[list[Outcome | BaseException]], n: int) -> None:
        self.fut = fut
        self.remaining = n
        self.results: list[Outcome | BaseException] = [_NOTHING] * n


_NOTHING = Outcome()

# Completions that may wait for one wake-up of the loop while more jobs are queued: fewer
# self-pipe writes and GIL hand-offs (measured: about 6 % less CPU per image than waking for
# each completion on 2 cores; 32 was no better than 8).
_WAKE_EVERY = 8


class ThreadDecodePool:
    """Decode in threads, straight into the ring's arrays.

    Jobs wait in a heap, lowest ``priority`` first (the pipeline's batch order: a later
    batch's samples never hold up an earlier one's that arrive after them), in the order
    they came within one priority; a plain queue of tokens wakes one thread per job.
    Results come back through a deque, and the event loop is woken only when no wake-up is
    already pending — and, while more jobs are queued, only once a few completions have
    gathered.  One wake-up serves many samples:
    fewer self-pipe writes, loop iterations and GIL hand-offs than one ``run_in_executor``
    future per sample.
    """

    def __init__(self, workers: int, spec: DecodeSpec, images: U8Array) -> None:
        self.workers = workers
        self.restarts = 0
        self._spec = spec
        self._images = images
        # (priority, arrival, (future, job) or (group, index in the group, job)), under
        # the lock; a True token per job wakes a thread, a False one stops it.
        self._jobs: list[tuple[int, int, tuple[Any, ...]]] = []
        self._arrival = itertools.count()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
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

    async def decode(self, job: DecodeJob, priority: int = 0) -> Outcome:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = self._loop.create_future()
        self._queue([(fut, job)], priority)
        return await fut

    async def decode_many(
        self, jobs: Sequence[DecodeJob], priority: int = 0
    ) -> list[Outcome | BaseException]:
        """The jobs of a batch as one group: one future and one wake-up for all of them
        (cache hits of a whole batch cost the loop almost nothing per sample)."""
        if not jobs:
            return []
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        group = _Group(self._loop.create_future(), len(jobs))
        self._queue([(group, i, job) for i, job in enumerate(jobs)], priority)
        return await group.fut

    def _queue(self, items: list[tuple[Any, ...]], priority: int) -> None:
        with self._lock:
            self._active += len(items)
            self._idle.clear()
            for item in items:
                heapq.heappush(self._jobs, (priority, next(self._arrival), item))
        for _ in items:
            self._tokens.put(True)

    def _work(self) -> None:
        try:
            self._work_until_stopped()
        finally:
            if self._spec.cache is not None:
                self._spec.cache.close()  # this thread's index connection

    def _work_until_stopped(self) -> None:
        images, spec = self._images, self._spec
        while True:
            if not self._tokens.get():
                return
            with self._lock:
                item = heapq.heappop(self._jobs)[2]
            target = item[0]
            job: DecodeJob = item[-1]
            fut: Any = target.fut if isinstance(target, _Group) else target
            outcome = _NOTHING
            err: BaseException | None = None
            if not fut.cancelled():  # racy but harmless: a late cancel just wastes one decode
                try:
                    outcome = run_job(job, images[job.slot, job.index], spec)
                except BaseException as exc:  # handed to the awaiting task
                    err = exc
            del job
            if isinstance(target, _Group):
                target.results[item[1]] = err if err is not None else outcome
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
                wake = not self._wake_pending and (len(self._done) >= _WAKE_EVERY or not self._jobs)
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

    async def aclose(self) -> None:
        """Stop the threads once their current jobs are done (joined off the loop)."""
        for _ in self._threads:
            self._tokens.put(False)
        try:
            await asyncio.to_thread(self._join)
        except RuntimeError:
            # Interpreter exit: no new threads may start any more; block here instead.
            self._join()
        self._deliver()

    def _join(self) -> None:
        for t in self._threads:
            t.join()
