"""Threads of our own that run an event loop, and how they end (a leaf module).

A thread that has talked to a store has used OpenSSL (TLS, request signing), and it is not
over when ``join()`` returns: OpenSSL's per-thread cleanup runs after its Python part, under
a process-wide lock.  A ``fork()`` in that window (a DataLoader starting its workers just
after a dataset listed its objects on a helper thread) copies the lock held, and the
child's first OpenSSL call waits on it forever (seen in a forked DataLoader worker:
``SSL_CTX_new`` -> ``ERR_set_mark`` -> ``CRYPTO_THREAD_write_lock``, in 4 of 10 runs of a
test under load).  So whoever ends such a thread waits until the operating system has
ended it (:func:`wait_exited`) before going on — and the threads of its event loop's
default executor too (``asyncio.to_thread``: botocore's credentials, which make TLS
contexts, run there), which ``asyncio.run`` joins and ``loop.close()`` does not even wait
for (:class:`ExitedExecutor`; seen as a forked DataLoader worker's ``SSL_CTX_new`` waiting
forever in ``get_credentials``, once in a suite run under load).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ._lifecycle import EXECUTOR_END

__all__ = ["ExitedExecutor", "run_here", "run_on_own_thread", "wait_exited"]

T = TypeVar("T")


def wait_exited(thread: threading.Thread, limit: float = 2.0) -> None:
    """After ``thread`` was joined: wait (``limit`` seconds at most) until the operating
    system has ended it too, C library thread-exit handlers included, so that a ``fork()``
    from now on copies none of the locks they take (see the module's docstring).  Linux
    only (``/proc/self/task``); elsewhere it returns at once."""
    tid = thread.native_id
    if tid is None or thread.is_alive():
        return
    task = f"/proc/self/task/{tid}"
    deadline = time.monotonic() + limit
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0005)


class ExitedExecutor(ThreadPoolExecutor):
    """An event loop's default executor whose threads can be waited out, for the operating
    system too (:meth:`end`; see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self.started: list[threading.Thread] = []
        super().__init__(thread_name_prefix=name, initializer=self._note)

    def _note(self) -> None:
        self.started.append(threading.current_thread())

    def end(self, limit: float) -> None:
        """Shut it down and wait, ``limit`` seconds at most, until its threads have ended
        (each for the operating system too, :func:`wait_exited`).  A thread still busy
        then (a call that ignores its time limit) is left to end on its own."""
        self.shutdown(wait=False)
        deadline = time.monotonic() + limit
        for thread in list(self.started):
            thread.join(max(0.0, deadline - time.monotonic()))
            wait_exited(thread)


def run_here(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` in this thread, returning once the threads its loop ran
    blocking calls on (``asyncio.to_thread``) have ended for the operating system too.
    Where a loop already runs in this thread (a notebook's, an async caller's), which
    ``asyncio.run`` refuses, ``coro`` runs on a thread of its own instead
    (:func:`run_on_own_thread`); blocking either way."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none: this thread's own
        pass
    else:
        return run_on_own_thread(coro)
    executor = ExitedExecutor("asyncloader-blocking-io")

    async def main() -> T:
        asyncio.get_running_loop().set_default_executor(executor)
        return await coro

    try:
        return asyncio.run(main())
    finally:
        executor.end(EXECUTOR_END)  # asyncio.run joined them: only the OS's end is left


def run_on_own_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end on an event loop of its own, in a thread of its own (so it
    can be called where a loop runs, as in a notebook); blocking.  Returns once that
    thread, and those its loop ran blocking calls on, have ended for the operating system
    too (:func:`run_here`, :func:`wait_exited`)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, run_here(coro)))
        except BaseException as exc:  # handed to the caller
            box.append((False, exc))

    thread = threading.Thread(target=run, name="asyncloader-blocking")
    thread.start()
    thread.join()
    wait_exited(thread)
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
