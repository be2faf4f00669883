"""The cache's writer thread: fetched objects to the SSD cache off the event loop and off
the decode path, a batch per index transaction."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .._base._types import Blob, derived_key
from . import ObjectCache

__all__ = ["WRITE_BEHIND", "CacheWriter"]

_Item = tuple[str, str, Blob, bool]  # key, cache key, bytes, stored already
_FLUSH = ("", "", b"", True)  # in the queue: write the batch gathered so far at once

WRITE_BEHIND = 64 * 2**20
"""Fetched bytes waiting for the writer at most, by default (a few hundred JPEGs)."""


class CacheWriter:
    """One thread writing fetched objects to the cache, a batch per index transaction, so
    that neither the event loop nor a decode worker waits on the disk.

    One writer measured fastest for ``warm``: two, each storing an entry per transaction so
    that their file writes overlap, gave 1327 objects/s against one writer's 1555 (6
    interleaved rounds, 256 in flight, 20 ms): they contend on SQLite's lock.  Objects come
    through a plain queue, without a future per object; at most ``max_bytes`` wait in it.

    A batch gathers for up to ``linger`` seconds after its first object (or until it holds
    32 entries, 16 MiB or half of ``max_bytes``).  A loader hands over about one object per
    millisecond, one at a time, and an index transaction costs about as much as writing
    110 KB to a pack: writing each on arrival cost 160 µs of CPU per object against 55 µs
    in batches of 16 or more (``put_many`` alone on this machine; inside a busy loader, 97
    µs in batches of about 30, most of it copying the bytes into the page cache).  Nothing
    waits on the write: the objects are in the cache ``linger`` later, and :meth:`drain`
    and :meth:`close` write at once.

    While it gathers, the thread sleeps until the linger ends or a batch is due (full, or
    asked for): it does not wake for each object.  Waking takes the GIL from the loop thread
    and the decode threads, about a thousand times a second in a cold epoch.  Cold epochs
    against the same epoch without a cache, 10 interleaved rounds in one run: 1.01 × its
    rate sleeping, 0.95 × waking for each object (CPU per image 1.06 × against 1.11 ×).

    Args:
        cache: Where the objects go.
        max_bytes: Most bytes waiting to be written (:meth:`full` says when it is reached):
            ``warm`` waits for room, the loader leaves objects uncached.
        done: Called on the writer thread with the object keys of each batch and None once
            written, or the exception that failed them (disk full, permissions).
        derive: Makes what is kept beside an object from its bytes, as (name, bytes) pairs
            (the scaled copies of a large JPEG); stored with it, in the same transaction,
            under :func:`~asyncloader._base._types.derived_key`.
        derive_threads: Threads running ``derive`` on a batch's objects at once (it must
            release the GIL to gain from more than one); 1: the writer thread itself.
        linger: Seconds a batch waits for more objects after its first one.
        remember: How many of the objects written last it remembers
            (:meth:`written_lately`): enough for the batches a loader has in flight.
    """

    _BATCH = 32  # entries per index transaction, at most
    _BATCH_BYTES = 16 * 2**20  # bytes per batch, at most (large photos: fewer entries)

    def __init__(
        self,
        cache: ObjectCache,
        *,
        max_bytes: int = WRITE_BEHIND,
        done: Callable[[list[str], Exception | None], None],
        derive: Callable[[Blob], list[tuple[str, bytes]]] | None = None,
        derive_threads: int = 1,
        linger: float = 0.025,
        remember: int = 0,
    ) -> None:
        self._cache = cache
        self._derive = derive
        self._derivers = (
            ThreadPoolExecutor(derive_threads, thread_name_prefix="asyncloader-derive")
            if derive is not None and derive_threads > 1
            else None
        )
        self._max_bytes = max_bytes
        self._linger = linger
        # A batch of half the bound is written at once: nobody waits on a lingering writer.
        self._batch_bytes = min(self._BATCH_BYTES, max(1, max_bytes // 2))
        self._done = done
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        # Bytes handed over (counted by the submitting thread), taken from the queue and
        # written (by the writer): each counter has one writer, so no lock.
        self._submitted = 0
        self._taken = 0
        self._written = 0
        # Flush and stop marks put in the queue and taken from it: while one waits, the
        # batch is written without lingering.
        self._marks_lock = threading.Lock()
        self._marks = 0
        self._marks_taken = 0
        # Set when a batch is due (full, or asked for): wakes the writer from its linger.
        self._due_now = threading.Event()
        # The bytes handed over and not yet written, by cache key: set on the submitting
        # thread, dropped by the writer once written (one dict operation each, atomic).
        self._held: dict[str, Blob] = {}
        # The cache keys written last, oldest first (set and trimmed by the writer only).
        self._remember = remember
        self._recent: dict[str, None] = {}
        self._room: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting = 0  # tasks in _wait: the writer wakes the loop only for them
        self.cpu_seconds = 0.0  # the writer thread's, once closed
        self._thread = threading.Thread(target=self._run, name="asyncloader-cache-write")
        self._thread.daemon = True  # never holds up the interpreter's exit
        self._thread.start()

    def full(self) -> bool:
        """Whether ``max_bytes`` are waiting to be written."""
        return self._submitted - self._written >= self._max_bytes

    async def room(self) -> None:
        """Wait until less than ``max_bytes`` waits (the disk catches up)."""
        await self._wait(lambda: not self.full())

    async def drain(self) -> None:
        """Wait until everything submitted so far is written (or failed); the batch being
        gathered is written at once."""
        target = self._submitted
        if self._written < target:
            self._mark(_FLUSH)
        await self._wait(lambda: self._written >= target)

    async def _wait(self, ready: Callable[[], bool]) -> None:
        # The writer thread sets the event after each batch while a task waits, waking
        # every waiting task at once; polling instead cost a timer per fetch every few ms.
        self._waiting += 1
        try:
            while not ready() and self._thread.is_alive():  # a dead writer writes no more
                if self._room is None:
                    self._room, self._loop = asyncio.Event(), asyncio.get_running_loop()
                self._room.clear()
                if ready() or not self._thread.is_alive():  # it got there before the event
                    break
                await self._room.wait()
        finally:
            self._waiting -= 1

    def submit(self, key: str, cache_key: str, data: Blob, *, stored: bool = False) -> None:
        """Queue ``data`` (verified fetched bytes, never changed afterwards) for
        ``cache_key``; ``key`` names it to ``done``.  ``stored``: the object is in the cache
        already, only what ``derive`` makes of it is to be stored (else nothing is derived
        from an object stored already: it was fetched twice)."""
        self._submitted += len(data)
        if not stored:
            self._held[cache_key] = data
        self._queue.put((key, cache_key, data, stored))
        if not self._due_now.is_set() and self._full_batch_waits():
            self._due_now.set()

    def _mark(self, mark: _Item | None) -> None:
        """Queue a flush (``_FLUSH``) or stop (None) mark, and wake the writer for it."""
        with self._marks_lock:
            self._marks += 1
            self._queue.put(mark)
        self._due_now.set()

    def _full_batch_waits(self) -> bool:
        """Whether the objects not yet taken by the writer make a full batch."""
        return (
            self._queue.qsize() >= self._BATCH or self._submitted - self._taken >= self._batch_bytes
        )

    def _due(self) -> bool:
        """Whether the batch being gathered is to be written now, without lingering."""
        return self._marks != self._marks_taken or self._full_batch_waits()

    def held(self, cache_key: str) -> Blob | None:
        """The bytes of ``cache_key`` if they wait to be written (not yet in the index): a
        batch that looked before they were written can use them instead of a fetch."""
        return self._held.get(cache_key)

    def written_lately(self, cache_key: str) -> bool:
        """Whether ``cache_key`` is among the last ``remember`` objects written: in the
        index now, though a batch's index query that ran before may have missed it."""
        return cache_key in self._recent

    def _run(self) -> None:
        try:
            done = False
            while not done:
                items, done = self._gather()
                if items:
                    self._write(items)
        finally:
            self.cpu_seconds = time.thread_time()
            if self._derivers is not None:
                self._derivers.shutdown()
            self._cache.close()  # this thread's pack file and index connection
            self._wake()  # whoever waits sees the thread gone

    def _gather(self) -> tuple[list[_Item], bool]:
        """The next batch (waits for its first object, then lingers unless a batch is due),
        and whether to stop after it."""
        first = self._queue.get()
        if first is not None and first is not _FLUSH:
            deadline = time.monotonic() + self._linger
            while not self._due():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._due_now.clear()
                if self._due():  # due just before the clear: that set() is not lost
                    break
                self._due_now.wait(left)
        items: list[_Item] = []
        size = 0
        item: _Item | None = first
        while True:
            if item is None or item is _FLUSH:
                self._marks_taken += 1
                if item is None:
                    return items, True
            else:
                items.append(item)
                size += len(item[2])
                self._taken += len(item[2])
            if len(items) >= self._BATCH or size >= self._batch_bytes:
                return items, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return items, False

    def _wake(self) -> None:
        room, loop = self._room, self._loop
        if self._waiting and room is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(room.set)

    def _write(self, items: list[_Item]) -> None:
        error: Exception | None = None
        try:
            entries: list[tuple[str, Blob | bytes]] = [(ck, data) for _, ck, data, _ in items]
            if self._derive is not None:
                have = self._cache.contains(ck for _, ck, _, stored in items if not stored)
                fresh = {ck: data for _, ck, data, stored in items if stored or ck not in have}
                datas = list(fresh.values())
                pool = self._derivers
                made = pool.map(self._derive, datas) if pool else map(self._derive, datas)
                for ck, derived in zip(fresh, made, strict=True):
                    entries += [(derived_key(ck, name), d) for name, d in derived]
            self._cache.put_many(entries)
        except Exception as exc:  # disk full, permissions: every object of the batch
            error = exc
        written = [ck for _, ck, _, stored in items if not stored]
        if error is None and self._remember:
            recent = self._recent
            for ck in written:  # remembered before they stop being held: never neither
                recent[ck] = None
            for ck in list(itertools.islice(recent, max(len(recent) - self._remember, 0))):
                del recent[ck]
        for ck in written:  # in the index now (or failed: fetched again)
            self._held.pop(ck, None)
        self._written += sum(len(data) for _, _, data, _ in items)
        self._done([k for k, _, _, _ in items], error)
        self._wake()

    def close(self) -> None:
        """Write what is queued, then stop the thread (blocks: call it off the loop)."""
        if self._thread.is_alive():
            self._mark(None)
            self._thread.join()
