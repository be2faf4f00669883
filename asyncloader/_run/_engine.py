"""An engine process: the child side of :mod:`._engines`.

A fresh interpreter (:func:`~asyncloader._base._child.launch`) that opens its own store and
runs an :class:`~._inline.InlineEngine` over its part of the batches, into a ring of its own
in shared memory that the training process maps.  Its main thread serves the trainer's
socket (start an epoch, the dataset, counters, stop); the event loop reads the slots the
trainer gives back from a pipe of their own and sends one notice per batch.

It lives as long as its trainer: the socket's end (the trainer closed the loader, or died,
even by SIGKILL) stops it, and its teardown unlinks its ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import queue
import shutil
import threading
import traceback
from collections.abc import Callable
from typing import Any

from .._base._child import receive_order, unpickle_order
from .._base._errors import PipelineDeadError
from .._base._stats import Counters
from .._stores import open_store
from ._control import (
    ASK_COUNTERS,
    COUNTERS,
    DATASET,
    FAILED,
    LISTED,
    NOTICE,
    READY,
    SLOT,
    START,
    EngineOrder,
)
from ._inline import InlineEngine
from ._notices import Failed, Notice
from ._pipeline import Pipeline

__all__ = ["engine_main"]


class _Sender(queue.Queue[Notice]):
    """The pipeline's output in an engine process: each notice goes to the trainer at once,
    stamped with the generation (the trainer's latest start) it was made for."""

    def __init__(self, send: Callable[[Any], None]) -> None:
        super().__init__()
        self._send = send
        self.generation = 0  # set on the loop, where notices are put

    def put(self, item: Notice, block: bool = True, timeout: float | None = None) -> None:
        if isinstance(item, Failed):
            item = Failed(_portable(item.error))
        self._send((NOTICE, self.generation, item))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as it can cross to the trainer: pickling keeps its notes but not the errors
    it was raised from nor its traceback, so their text becomes a note."""
    exc.add_note(
        f"in engine process {os.getpid()}:\n" + "".join(traceback.format_exception(exc)).rstrip()
    )
    e: BaseException | None = exc
    while e is not None:  # no frames (and the ring views they hold) go along
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


def engine_main(fd: int) -> None:
    """Entry point of an engine process, with its socket as ``fd``."""
    got = receive_order(fd)
    if got is None:
        return
    conn, main, (order_bytes,) = got
    lock = threading.Lock()

    def send(msg: Any) -> None:
        with lock:
            conn.send(msg)

    try:
        order: EngineOrder = unpickle_order(order_bytes, main)
    except BaseException as exc:
        error = PipelineDeadError(
            f"engine process could not start: {exc}\nA hook defined in the training script "
            "makes engine processes import the script: guard its entry point with "
            "`if __name__ == '__main__':`, or run the engine in this process with "
            "EngineConfig(mode='inline')"
        )
        with contextlib.suppress(Exception):
            send((FAILED, error))
        return
    try:
        _serve(conn, order, send)
    except (EOFError, OSError):
        pass  # the trainer is gone
    finally:
        if order.budget_folder is not None and order.folder is None and order.part[0] == 0:
            shutil.rmtree(order.budget_folder, ignore_errors=True)


def _serve(conn: Any, order: EngineOrder, send: Callable[[Any], None]) -> None:
    output = _Sender(send)
    engine = InlineEngine(order.plan, Counters(), output)
    try:
        dataset = None
        if order.await_dataset:
            tag, dataset = conn.recv()
            assert tag == DATASET
        try:
            store = open_store(order.url, **order.store_options)
            engine.setup(
                store,
                labels=order.labels,
                extensions=order.extensions,
                objects=order.objects,
                dataset=dataset,
                folder=order.folder,
                max_age=order.max_age,
                store_options=order.store_options,
                stream=order.stream,
                listed=None,
                device=None,
                cache=order.cache,
                part=order.part,
                budget_folder=order.budget_folder,
                shared_ring=True,
            )
        except BaseException as exc:
            send((FAILED, exc))
            return
        pipeline = engine.pipeline
        ring = engine.rt.ring
        assert ring is not None
        assert ring.shm_name is not None
        listing = pipeline.listing
        lead = order.part[0] == 0 and dataset is None
        # Read once: a listing that completes after this is announced by the task below.
        listed = listing.dataset if lead else None
        send((READY, ring.shm_name, ring.slots, listed))
        loop = engine.rt.loop
        if lead and listed is None:
            engine.rt.call_soon(_announce_listing, engine, send)
        engine.rt.call_soon(
            loop.add_reader, order.release_fd, _released, order.release_fd, pipeline
        )
        while True:
            msg = conn.recv()
            if msg is None:  # stop: tear down, then the final counts (cache writes too)
                engine.close()
                send((COUNTERS, engine.engine_counters()))
                return
            tag = msg[0]
            if tag == START:
                _, generation, epoch, first, span = msg
                engine.call(_restart(pipeline, output, generation, epoch, first, span))
            elif tag == ASK_COUNTERS:
                send((COUNTERS, engine.call(_counters(engine))))
    finally:
        engine.close()


def _announce_listing(engine: InlineEngine, send: Callable[[Any], None]) -> None:
    """On the loop: tell the trainer the dataset once a growing listing is complete."""
    listing = engine.pipeline.listing

    async def wait() -> None:
        try:
            dataset = await listing.complete()
        except Exception as exc:  # it fails the pipeline too; the trainer may ask first
            send((LISTED, None, _portable(exc)))
        else:
            send((LISTED, dataset, None))

    engine.rt.loop.create_task(wait())


def _released(fd: int, pipeline: Pipeline) -> None:
    """On the loop: slots the trainer gave back."""
    try:
        data = os.read(fd, 4096)
    except BlockingIOError:
        return
    except OSError:
        data = b""
    if not data:  # the trainer is gone: its socket ends too, and the main thread stops
        asyncio.get_running_loop().remove_reader(fd)
        return
    for (slot,) in SLOT.iter_unpack(data):
        pipeline.release(slot)


async def _restart(
    pipeline: Pipeline,
    output: _Sender,
    generation: int,
    epoch: int,
    first: int,
    span: tuple[int, int] | None,
) -> None:
    """Production restarts at ``epoch``/``first``: what the old one announces until it has
    stopped carries the old generation (the trainer drops it and gives its slots back)."""
    await pipeline.stop()
    output.generation = generation
    await pipeline.start(epoch, first, span)


async def _counters(engine: InlineEngine) -> Counters:
    """A copy of the counters, taken on the loop that writes them."""
    return copy.deepcopy(engine.engine_counters())
