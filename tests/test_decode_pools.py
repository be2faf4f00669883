"""The decode pool runs queued jobs lowest priority first (the pipeline's batch order), in
the order they came within one priority: a later batch's samples, ready at once (cache
hits of the next epoch), never hold up an earlier batch's that arrive after them."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import numpy.typing as npt

from asyncloader._base._types import DecodeJob
from asyncloader._decode import DecodeSpec, ThreadDecodePool
from asyncloader._device._ring import BatchRing

SHAPE = (1, 1, 1)
# (name, priority) in the order they are queued, and the order they must run in.
QUEUED = [("e", 5), ("c", 3), ("g", 9), ("d", 3), ("a", 1), ("f", 5), ("b", 2)]
EXPECTED = ["a", "b", "c", "d", "e", "f", "g"]


def test_threads_run_queued_jobs_by_priority_then_arrival() -> None:
    ran: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def hook(data: bytes) -> npt.NDArray[np.uint8]:
        if data == b"first":  # holds the one thread while the others are queued
            entered.set()
            release.wait(10)
        ran.append(data.decode())
        return np.zeros(SHAPE, np.uint8)

    ring = BatchRing(2, len(QUEUED) + 1, SHAPE, shared=False)

    async def run() -> None:
        pool = ThreadDecodePool(1, DecodeSpec(SHAPE, decode_fn=hook), ring.images)
        try:
            first = asyncio.create_task(pool.decode(DecodeJob(b"first", 0, 0, 0, "first"), 0))
            assert await asyncio.to_thread(entered.wait, 10)
            tasks: list[asyncio.Task[object]] = []
            for i, (name, p) in enumerate(QUEUED, 1):
                job = DecodeJob(name.encode(), 0, i, 0, name)
                if name == "d":  # a group (a batch's cache hits): its jobs at one priority
                    tasks.append(asyncio.create_task(pool.decode_many([job], p)))
                else:
                    tasks.append(asyncio.create_task(pool.decode(job, p)))
            await asyncio.sleep(0)  # every task has queued its job
            release.set()
            await asyncio.gather(first, *tasks)
        finally:
            await pool.aclose()

    asyncio.run(run())
    assert ran == ["first", *EXPECTED]
