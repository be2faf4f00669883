"""An engine process: the child side of :mod:`._engines`.

A fresh interpreter (:func:`~asyncloader._loader._launch.launch`) that opens its own store and
runs a :class:`~._local.LocalEngine` over its part of the batches, into a ring of its own in
shared memory that the training process made and maps.  Its main thread serves the trainer's
socket (start an epoch, the dataset, counters, stop); the event loop reads the slots the
trainer gives back from a pipe of their own and sends one notice per batch.

It lives as long as its trainer: the socket's end (the trainer closed the loader, or died,
even by SIGKILL) stops it, and its teardown unlinks its ring.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable
from typing import Any

from .._base._errors import PipelineDeadError
from .._base._stats import Counters
from .._run._notices import Failed, Notice
from .._run._pipeline import Pipeline
from .._stores import open_sources, open_store
from ._launch import receive_order, unpickle_order
from ._local import LocalEngine
from ._wire import (
    SLOT,
    AskCounters,
    ChildFailed,
    Counts,
    CrossedError,
    EngineOrder,
    EngineReady,
    Listed,
    Message,
    Produced,
    ProductionFailed,
    StartEpoch,
    Stop,
    TakeDataset,
    send,
)

__all__ = ["engine_main"]

Send = Callable[[Message], None]


class _Sender:
    """The pipeline's outbox in an engine process: each notice goes to the trainer at once,
    stamped with the generation (the trainer's latest start) it was made for."""

    def __init__(self, send: Send, where: str) -> None:
        self._send = send
        self._where = where
        self.generation = 0  # set on the loop, where notices are put

    def put(self, notice: Notice) -> None:
        if isinstance(notice, Failed):
            error = CrossedError.of(notice.error, self._where)
            self._send(ProductionFailed(self.generation, error))
        else:
            self._send(Produced(self.generation, notice))


def _main_script_advice(exc: BaseException) -> str:
    """The ``__main__`` advice, where the order failed in the user's script (a hook defined
    there that the engine imports); nothing otherwise."""
    text = f"{exc!r}"
    if "__main__" in text or "__mp_main__" in text or "bootstrapping phase" in text:
        return (
            "\nA hook defined in the training script makes engine processes import the "
            "script: guard its entry point with `if __name__ == '__main__':`, or run the "
            "engine in this process with EngineConfig(mode='inline')"
        )
    return ""


def engine_main(fd: int) -> None:
    """Entry point of an engine process, with its socket as ``fd``."""
    got = receive_order(fd)
    if got is None:
        return
    conn, main, order_bytes = got
    lock = threading.Lock()
    where = f"engine process {os.getpid()}"

    def safe_send(msg: Message) -> None:
        with lock:
            send(conn, msg, where)

    try:
        order: EngineOrder = unpickle_order(order_bytes, main)
    except BaseException as exc:
        error = PipelineDeadError(f"{where} could not start: {exc!r}{_main_script_advice(exc)}")
        error.__cause__ = exc
        with contextlib.suppress(Exception):
            safe_send(ChildFailed(CrossedError.of(error, where)))
        return
    try:
        _serve(conn, order, safe_send, where)
    except (EOFError, OSError):
        pass  # the trainer is gone
    finally:
        share = order.share
        if share.budget_folder is not None and order.spec.folder is None and share.part[0] == 0:
            shutil.rmtree(share.budget_folder, ignore_errors=True)
    _leave()


def _leave() -> None:
    """End the process now that its engine is torn down (ring unlinked, cache written,
    final counts sent): the interpreter's own teardown of its modules and their memory
    took 50-100 ms that the trainer's ``close()`` waited for, loader after loader.  Output
    and logs are flushed first; non-daemon threads of a user's hook are not waited for (the
    trainer would stop them after its grace anyway)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _serve(conn: Any, order: EngineOrder, send: Send, where: str) -> None:
    output = _Sender(send, where)
    spec = order.spec
    engine = LocalEngine(spec.plan, Counters(), output)
    try:
        dataset = None
        if order.await_dataset:
            msg = conn.recv()
            if not isinstance(msg, TakeDataset):  # Stop: the trainer gave up meanwhile
                return
            dataset = msg.dataset
        start = order.start
        if start is not None:
            output.generation = start.generation
        try:
            store = (
                open_sources(spec.sources)
                if spec.sources
                else open_store(spec.url, **spec.store_options)
            )
            where_from = (0, 0, None) if start is None else (start.epoch, start.first, start.span)
            engine.setup(store, spec, order.share, dataset=dataset, start=where_from)
        except BaseException as exc:
            send(ChildFailed(CrossedError.of(exc, where)))
            return
        pipeline = engine.pipeline
        listing = pipeline.listing
        lead = order.share.part[0] == 0 and dataset is None
        # Read once: a listing that completes after this is announced by the task below.
        listed = listing.dataset if lead else None
        send(EngineReady(listed))
        loop = engine.rt.loop
        if lead and listed is None:
            engine.rt.call_soon(_announce_listing, engine, send, where)
        engine.rt.call_soon(
            loop.add_reader, order.release_fd, _released, order.release_fd, pipeline
        )
        while True:
            msg = conn.recv()
            if isinstance(msg, Stop):  # tear down, then the final counts (cache writes too)
                engine.close()
                send(Counts(engine.engine_counters()))
                return
            if isinstance(msg, StartEpoch):
                engine.call(engine.restart(msg.generation, msg.epoch, msg.first, msg.span))
            elif isinstance(msg, AskCounters):
                send(Counts(engine.call(_counters(engine))))
    finally:
        engine.close()


def _announce_listing(engine: LocalEngine, send: Send, where: str) -> None:
    """On the loop: tell the trainer the dataset once a growing listing is complete."""
    listing = engine.pipeline.listing

    async def wait() -> None:
        try:
            dataset = await listing.complete()
        except Exception as exc:  # it fails the pipeline too; the trainer may ask first
            send(Listed(None, CrossedError.of(exc, where)))
        else:
            send(Listed(dataset, None))

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


async def _counters(engine: LocalEngine) -> Counters:
    """A copy of the counters, taken on the loop that writes them."""
    return copy.deepcopy(engine.engine_counters())
