"""Every start and stop bound of the loader's threads and processes, in one place, with why
(a leaf).  All in [seconds].

A stop escalates ask → terminate → kill; each stage waits no longer than the one above it
gives it, so a part is never killed in the middle of its own orderly teardown::

    trainer: ENGINE_GRACE ─────────────────────────────────────────────► terminate, kill
    engine:  ENGINE_TEARDOWN = RUNTIME_SHUTDOWN + LOOP_JOIN
               RUNTIME_SHUTDOWN = STOP_PRODUCTION + WRITER_DRAIN + POOL_STOP
                                  + STORE_CLOSE + TASKS_CANCEL
               POOL_STOP ≥ 3 × WORKER_STEP (ask, terminate, kill each decode worker)

Normal teardown takes a fraction of a second; these bound what a stuck part can cost.
``tests/test_lifecycle.py`` holds the inequalities.
"""

from __future__ import annotations

__all__ = [
    "CHILD_EXIT",
    "COUNTERS_REPLY",
    "ENGINE_GRACE",
    "ENGINE_START",
    "ENGINE_TEARDOWN",
    "FINAL_COUNTS",
    "HELD_GRACE",
    "KILL_STEP",
    "LOOP_JOIN",
    "MEMORY_LOOK",
    "POOL_STOP",
    "READER_JOIN",
    "RUNTIME_SHUTDOWN",
    "STOP_PRODUCTION",
    "STORE_CLOSE",
    "TASKS_CANCEL",
    "WAIT_SLICE",
    "WORKER_DRAIN",
    "WORKER_START",
    "WORKER_STEP",
    "WRITER_DRAIN",
]

# --- starting ----------------------------------------------------------------------------

ENGINE_START = 120.0
"""An engine process's start: a fresh interpreter, its imports (~0.5 s here), the store's
credentials, and the listing of the lead engine (a million keys of a saved listing read in
seconds; a fresh LIST of them over a slow link takes longer).  Then it is said not to start."""

WORKER_START = 60.0
"""Decode workers' start, all of them: interpreters, numpy and Pillow, and the user's
``__main__`` where a ``decode=`` hook is defined there (which may import torch)."""

CHILD_EXIT = 5.0
"""Waiting for the exit code of a child whose socket ended while it started, to name it."""

# --- running -----------------------------------------------------------------------------

COUNTERS_REPLY = 5.0
"""``stats()``'s wait for the engines' counters (a millisecond when they are well); an
engine that does not answer by then is left out of the sum."""

WAIT_SLICE = 0.1
"""How often a consumer waiting for its next batch checks that its engine lives."""

MEMORY_LOOK = 1.0
"""How often the trainer notes each engine process's memory (one small read of ``/proc``
each): the last figure is what an engine's death by SIGKILL names."""

HELD_GRACE = 3.0
"""How long a consumer that holds every ring slot waits for one to come back (another
thread of the user's may still drop a batch) before it is told so."""

WORKER_DRAIN = 30.0
"""A restart's wait for the decode jobs that workers hold (they write into ring slots that
the new epoch reuses): one job is one image, milliseconds; a huge image a few seconds."""

# --- stopping, inside an engine (or the inline engine's loop) ----------------------------

STOP_PRODUCTION = 10.0
"""Cancel production and wait for the decodes in flight (bounded by WORKER_DRAIN, cut here)."""

WRITER_DRAIN = 20.0
"""The cache writer's last batch: at most 64 MiB wait for it, 20 s at ~3 MB/s of a disk
that is failing; a writer still busy then loses what it held (those objects are fetched
again next time)."""

WORKER_STEP = 2.0
"""Each step of a decode worker's stop: asked, then terminated, then killed."""

POOL_STOP = 3 * WORKER_STEP + 4.0
"""The decode pool's stop: its three steps, and the sender threads' ends."""

STORE_CLOSE = 5.0
"""The store's connections closed (TLS close-notify to a peer that may not answer)."""

TASKS_CANCEL = 5.0
"""What else runs on the loop, cancelled and awaited."""

RUNTIME_SHUTDOWN = STOP_PRODUCTION + WRITER_DRAIN + POOL_STOP + STORE_CLOSE + TASKS_CANCEL
"""A runtime's whole shutdown on its loop, its steps in order."""

LOOP_JOIN = 5.0
"""The loop thread's end once the loop is stopped."""

EXECUTOR_END = 2.0
"""The threads of a loop's default executor (``asyncio.to_thread``'s), once the loop has
ended: each waited out for the operating system too, so that a ``fork()`` after copies no
lock their C exit handlers hold (``_own_thread``)."""

ENGINE_TEARDOWN = RUNTIME_SHUTDOWN + LOOP_JOIN + EXECUTOR_END
"""An engine's own teardown, at most."""

# --- stopping, from the trainer ----------------------------------------------------------

ENGINE_GRACE = ENGINE_TEARDOWN + 5.0
"""How long the trainer waits for an engine it asked to stop before it terminates it: the
engine's own teardown, and its final counters on the way back."""

KILL_STEP = 2.0
"""Each of terminate and kill, for a child that did not stop when asked."""

READER_JOIN = 2.0
"""The trainer's reader thread, once every engine's socket is closed."""

FINAL_COUNTS = 2.0
"""The trainer's ``close()``, once its engines have ended, for the reader thread to take
each one's last message (its final counters) and meet its socket's end, before it closes
the sockets: an engine ends within milliseconds of sending them."""
