"""One thread of its own for a cache's index queries, off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["IndexThread"]

T = TypeVar("T")


class IndexThread:
    """One thread of its own for a cache's index queries, off the event loop.

    A SQLite connection belongs to the thread that opened it, so the thread that queried
    the index is the one that closes its connection: :meth:`close` runs ``close_cache``
    (the cache's ``close``, which closes this thread's connection) there before the thread
    ends.  One thread, so queries answer in the order they were asked, on one connection.
    """

    def __init__(self, close_cache: Callable[[], None], name: str) -> None:
        self._close_cache = close_cache
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._closed = False

    def run(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """``fn(*args)`` on the index thread, awaited from the running loop."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Close the thread's index connection there, then end the thread (blocks until
        queries asked before have answered; call off the loop).  Idempotent."""
        if not self._closed:
            self._closed = True
            self._pool.submit(self._close_cache)
            self._pool.shutdown()
