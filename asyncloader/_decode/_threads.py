"""Decode in threads of the training process, straight into the ring's arrays.

Pillow releases the GIL while it decodes and resizes, so on few cores threads match or beat
processes, with no pipe traffic at all.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import queue
import threading
from collections.abc import Sequence

from .._base._types import DecodeJob, Outcome
from ._completions import Completions, Group, Target
from ._image import DecodeSpec, U8Array
from ._job import run_job, sample_view
from ._ship import Shipper

__all__ = ["ThreadDecodePool"]

_NOTHING = Outcome()


class ThreadDecodePool:
    """Decode in threads, straight into the ring's arrays.

    Jobs wait in a heap, lowest ``priority`` first (the pipeline's batch order: a later
    batch's samples never hold up an earlier one's that arrive after them), in the order
    they came within one priority; a plain queue of tokens wakes one thread per job.
    Results go back to the loop through :class:`~._completions.Completions` (one wake-up
    for many samples).

    With a ``shipper`` (GPU decode, the engine in a process of its own) a job's JPEG is
    shipped to the training process instead (:mod:`._ship`; the pipeline's priority is
    the batch's place in the stream, which the shipper keeps each slot's arena by).
    """

    def __init__(
        self, workers: int, spec: DecodeSpec, images: U8Array, shipper: Shipper | None = None
    ) -> None:
        self.workers = workers
        self._spec = spec
        self._images = images
        self._shipper = shipper
        # (priority, arrival, (target, job)), under the lock; a True token per job wakes a
        # thread, a False one stops it.
        self._jobs: list[tuple[int, int, tuple[Target, DecodeJob]]] = []
        self._arrival = itertools.count()
        self._tokens: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._results = Completions()
        # Daemon: aclose() stops and joins them (the runtime's teardown, bounded); one stuck
        # in a decode (C code, a huge image) past that bound must not hang interpreter exit.
        self._threads = [
            threading.Thread(target=self._work, name=f"asyncloader-decode-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    async def decode(self, job: DecodeJob, priority: int = 0) -> Outcome:
        fut = self._results.future()
        self._queue([(fut, job)], priority)
        return await fut  # type: ignore[no-any-return]

    async def decode_many(
        self, jobs: Sequence[DecodeJob], priority: int = 0
    ) -> list[Outcome | BaseException]:
        """The jobs of a batch as one group: one future and one wake-up for all of them
        (cache hits of a whole batch cost the loop almost nothing per sample)."""
        if not jobs:
            return []
        group = Group(self._results.future(), len(jobs))
        self._queue([((group, i), job) for i, job in enumerate(jobs)], priority)
        return await group.fut

    def _queue(self, items: list[tuple[Target, DecodeJob]], priority: int) -> None:
        with self._results.lock:
            self._results.started(len(items))
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
        images, spec, results, shipper = self._images, self._spec, self._results, self._shipper
        while True:
            if not self._tokens.get():
                return
            with results.lock:
                priority, _, (target, job) = heapq.heappop(self._jobs)
            result: Outcome | BaseException = _NOTHING
            if not results.cancelled(target):
                try:
                    if shipper is not None:
                        result = shipper.run(job, priority)
                    else:
                        result = run_job(job, sample_view(images, job), spec)
                except BaseException as exc:  # handed to the awaiting task
                    result = exc
            del job
            results.finish([(target, result)], more_queued=bool(self._jobs))
            del target, result

    async def drain(self) -> None:
        """Wait until no job is queued or running: only then can slots be reused."""
        await self._results.drain()

    async def aclose(self) -> None:
        """Stop the threads once their current jobs are done (joined off the loop)."""
        for _ in self._threads:
            self._tokens.put(False)
        try:
            await asyncio.to_thread(self._join)
        except RuntimeError:
            # Interpreter exit: no new threads may start any more; block here instead.
            self._join()
        self._results.deliver()

    def _join(self) -> None:
        for t in self._threads:
            t.join()
