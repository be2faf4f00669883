"""Threads of our own that run an event loop, and how they end (a leaf module).

A thread that has talked to a store has used OpenSSL (TLS, request signing), and it is not
over when ``join()`` returns: OpenSSL's per-thread cleanup runs after its Python part, under
a process-wide lock.  A ``fork()`` in that window (a DataLoader starting its workers just
after a dataset listed its objects on a helper thread) copies the lock held, and the
child's first OpenSSL call waits on it forever (seen in a forked DataLoader worker:
``SSL_CTX_new`` -> ``ERR_set_mark`` -> ``CRYPTO_THREAD_write_lock``, in 4 of 10 runs of a
test under load).  So whoever ends such a thread waits until the operating system has
ended it (:func:`wait_exited`) before going on.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_on_own_thread", "wait_exited"]

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


def run_on_own_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end on an event loop of its own, in a thread of its own (so it
    can be called where a loop runs, as in a notebook); blocking.  Returns once that
    thread has ended for the operating system too (:func:`wait_exited`)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, asyncio.run(coro)))
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
