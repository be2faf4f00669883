"""Waits on an event loop that end within a fraction of a millisecond of when they are due.

asyncio's own timers wake up to a millisecond late: the selector's timeout is rounded up to
whole milliseconds (epoll's resolution), so a wait of 7.1 ms ends after 8.  That is nothing
for a retry's back-off and most of the error for a paced request: against a strict rate
limiter (nginx's ``limit_req`` refuses a request sent sooner than ``1 / rate`` after the
last one it took, counted in whole milliseconds) a pace whose every turn comes half a
millisecond late delivers 7 % less than the pace, and one that makes up for late turns
sends others early, which the limiter refuses (``benchmarks/bench_servers.py``).

:class:`PreciseTimer` keeps one daemon thread that sleeps until the earliest due wait (a
condition's timed wait: the kernel's high-resolution timers) and wakes its loop with
``call_soon_threadsafe``; the loop then runs the waiter as soon as its current callback
ends.  The thread is started at the first wait and ends after ``idle`` seconds without one
(a loader that is no longer paced keeps no thread).  A forked child does not inherit the
thread, and may inherit the condition's lock held: :func:`precise_sleep`'s timer (one per
process, for every loop in it) starts afresh in a child, its waits left to the parent.

A leaf module: asyncio and the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import threading
import time

__all__ = ["PreciseTimer", "precise_sleep"]


class PreciseTimer:
    """Sub-millisecond waits for coroutines on any event loop (see the module's docstring).

    Args:
        idle: Seconds without a wait after which the thread ends (started again by the
            next wait).
    """

    def __init__(self, idle: float = 5.0) -> None:
        self._idle = idle
        self._fresh()

    def _fresh(self) -> None:
        """No thread, no waits, a new condition (at first, and in a forked child)."""
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties in ``_due`` by arrival, never by future
        self._thread: threading.Thread | None = None

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (``time.monotonic``'s): return within about 0.1 ms of when due,
        or at once for ``seconds <= 0``.  Cancellable."""
        if seconds <= 0:
            return
        # Due from now, read before the lock: the thread may hold it a while on a busy
        # machine (descheduled between two wake-ups), and a wait that took its due after
        # that could end after one asked later for an earlier time.
        due = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._cond:
            heapq.heappush(self._due, (due, next(self._order), loop, fut))
            self._start()
            self._cond.notify()
        await fut  # a cancelled wait stays queued until due: its wake-up finds it done

    def _start(self) -> None:
        """Start the thread where none runs (under the condition)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="asyncloader-timer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._due:
                    if not self._cond.wait(self._idle) and not self._due:
                        self._thread = None  # idle: the next wait starts another
                        return
                    continue
                left = self._due[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                _, _, loop, fut = heapq.heappop(self._due)
                with contextlib.suppress(RuntimeError):  # a loop closed since: nothing to wake
                    loop.call_soon_threadsafe(_wake, fut)


_TIMER = PreciseTimer()
os.register_at_fork(after_in_child=_TIMER._fresh)


async def precise_sleep(seconds: float) -> None:
    """Wait ``seconds``, ending within about 0.1 ms of when due (this process's
    :class:`PreciseTimer`)."""
    await _TIMER.sleep(seconds)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
