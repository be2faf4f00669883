"""The one owned event-loop thread, and the teardown order of everything that lives on it.

A :class:`Runtime` is a non-daemon thread running an asyncio loop, with the pipeline, the
decode pool, the store, the ring and the uploader it must tear down.  It is kept apart from
the loader so that a ``weakref.finalize`` and the exit hook can close it without keeping the
loader alive.  ``close()`` stops, in this order: production (waiting for in-flight decodes),
the decode pool, the store's connections, the loop thread, the uploader, and last the ring,
because workers write into it until they are gone (and batches still held keep its memory).

Interpreter exit closes every runtime still open before the interpreter joins non-daemon
threads (a plain ``atexit`` hook runs after that join: too late, exit would hang).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .._base import _lifecycle as life
from .._base._errors import PipelineDeadError
from .._base._own_thread import ExitedExecutor, wait_exited
from .._base._types import ObjectStore
from .._decode import DecodePool
from .._device._ring import BatchRing

if TYPE_CHECKING:
    from .._device._upload import Uploader
    from ._pipeline import Pipeline

__all__ = ["Runtime"]

T = TypeVar("T")
_live: weakref.WeakSet[Runtime] = weakref.WeakSet()


class Runtime:
    """The event-loop thread and everything that must be torn down with it.

    Kept apart from :class:`ImageLoader` so that a ``weakref.finalize`` and the exit hook can
    close it without keeping the loader alive.
    """

    def __init__(
        self, loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    ) -> None:
        self.loop = loop_factory()
        # Its blocking calls' threads (asyncio.to_thread), waited out at close as the loop
        # thread is: loop.close() would leave them ending on their own (see _own_thread).
        self._executor = ExitedExecutor("asyncloader-io")
        self.loop.set_default_executor(self._executor)
        _live.add(self)
        self.thread = threading.Thread(target=self._main, name="asyncloader-loop", daemon=False)
        self.closed = False
        self.pipeline: Pipeline | None = None
        self.pool: DecodePool | None = None
        self.store: ObjectStore | None = None
        self.ring: BatchRing | None = None
        self.uploader: Uploader | None = None
        # A listing that goes on while batches are made: held here, as the loop holds
        # tasks only weakly (one dropped would be collected mid-listing).
        self.listing_task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it (interruptible by Ctrl-C)."""
        if not self.thread.is_alive():
            coro.close()
            raise PipelineDeadError("the event-loop thread is not running")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        if not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(fn, *args)

    async def _shutdown(self) -> None:
        # Order matters: stop producing (and wait for in-flight decodes), then the pool,
        # then connections.  Each step is bounded (_base/_lifecycle), so shutdown cannot
        # hang, and together they fit RUNTIME_SHUTDOWN.
        if self.pipeline is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pipeline.stop(), life.STOP_PRODUCTION)
            with contextlib.suppress(Exception):  # what waits for the disk (64 MB at most)
                await asyncio.wait_for(
                    asyncio.to_thread(self.pipeline.close_threads), life.WRITER_DRAIN
                )
            self.pipeline.fetcher.close()
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.aclose(), life.POOL_STOP)
        if self.store is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.store.close(), life.STORE_CLOSE)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=life.TASKS_CANCEL)

    def close(self) -> None:
        """Stop everything; idempotent and safe from any thread but the loop's."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            if self.thread.is_alive():
                fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
                with contextlib.suppress(Exception):
                    fut.result(life.RUNTIME_SHUTDOWN)
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(life.LOOP_JOIN)
                wait_exited(self.thread)  # a fork from now on is safe (see _own_thread)
            if not self.thread.is_alive() and not self.loop.is_closed():
                self.loop.close()
            self._executor.end(life.EXECUTOR_END)  # and after its helpers' ends too
        finally:
            if self.uploader is not None:
                with contextlib.suppress(Exception):
                    self.uploader.close()  # unregisters the ring's pages before unmapping
            if self.ring is not None:
                self.ring.close()  # last: workers may write into it until they are gone


def _close_all_at_exit() -> None:
    for rt in list(_live):
        rt.close()


# Runs before the interpreter joins non-daemon threads (plain atexit runs after, too late:
# exit would hang on the loop thread of a loader nobody closed).
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_close_all_at_exit)
else:  # pragma: no cover
    import atexit

    atexit.register(_close_all_at_exit)
