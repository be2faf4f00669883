"""A DataLoader worker's exit, made safe for the batches still on their way (a leaf module).

A DataLoader worker hands each batch to a ``multiprocessing`` queue, whose feeder thread
(a daemon, named ``QueueFeederThread``) pickles it in the background: for a tensor, torch's
``_share_fd_cpu_`` copies its storage into shared memory in C++ with the GIL released.
When the training process shuts the workers down (the iterator deleted, or a ``break`` out
of the loop, mid-epoch), torch's worker loop gives up waiting for that thread
(``cancel_join_thread``) and returns.  A worker started by ``fork`` then ends with
``os._exit``; one started by ``spawn`` (or ``forkserver``) finalizes its interpreter, and
CPython ends a daemon thread that wants the GIL back during finalization with
``pthread_exit``, whose unwinding through the C++ frame (a ``noexcept`` destructor that
re-takes the GIL) calls ``std::terminate``: the worker aborts ("terminate called without an
active exception") and the training process's DataLoader reports it killed by SIGABRT, at
whatever line it is on.  Seen once in this package's suite; shown by
``benchmarks/worker_exit_abort.py``, where most spawned workers of a plain DataLoader of
8 MB tensors, deleted after 3 batches, abort so, and none with this hook.

:func:`let_feeders_finish_at_exit` registers, once per process, an ``atexit`` hook (run
before finalization) that waits, ``FEEDER_WAIT`` seconds at most, for the process's queue
feeder threads to end: once the queue is closed (torch closes it), a feeder ends as soon as
its last batch is written, which takes milliseconds.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

__all__ = ["FEEDER_WAIT", "let_feeders_finish_at_exit"]

FEEDER_WAIT = 2.0
"""Seconds, at most, a DataLoader worker's exit waits for its queue feeder threads."""
_FEEDER_NAME = "QueueFeederThread"
"""The name ``multiprocessing.queues.Queue`` gives its feeder thread."""
_registered_in: list[int] = []  # the process that registered the hook (a fork copies it)


def let_feeders_finish_at_exit() -> None:
    """In a DataLoader worker: at exit, wait for its queue feeder threads (see the module's
    docstring).  Registered once per process."""
    if _registered_in == [os.getpid()]:
        return
    _registered_in[:] = [os.getpid()]
    atexit.register(wait_for_feeders, FEEDER_WAIT)


def wait_for_feeders(limit: float) -> int:
    """Join this process's queue feeder threads, ``limit`` seconds at most in all; how many
    were still running when it gave up."""
    deadline = time.monotonic() + limit
    left = 0
    for thread in threading.enumerate():
        if thread.name == _FEEDER_NAME and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
            left += thread.is_alive()
    return left
