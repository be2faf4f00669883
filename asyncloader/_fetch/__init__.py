"""Fetch: object bytes from a store with bounded concurrency, retries, hedges, ranges and
checks.

Runs on the loader's (or ``warm``'s) event loop.  It never touches the cache's values: the
decode workers write fetched bytes back, ``warm``'s writer thread stores them.

The in-flight budget, adaptive and shared by a node's loaders, is ``_base._budget``'s.
"""

from __future__ import annotations

import asyncio
import os
import random
import warnings
from functools import partial

from .._base._budget import InflightBudget
from .._base._config import FetchConfig
from .._base._env import usable_cpus
from .._base._errors import LengthMismatch, StoreError, Throttled, not_listed, shown_key
from .._base._node_share import NodeShare
from .._base._stats import Counters
from .._base._types import Blob, ObjectInfo, ObjectStore
from .._stores._http_objects import whole_answer
from .._stores._retry import retry_reason, retrying

__all__ = ["Fetcher"]


class Fetcher:
    """Fetches whole objects with bounded concurrency, retries, hedges, ranges and checks.

    Hedging: a request not answered within a deadline learned from this run — ``hedge_factor``
    × the ``hedge_quantile`` of recent request latencies, at least ``hedge_floor`` — gets a
    second, identical request (same range, same ETag precondition); the first complete,
    verified answer wins and the other request is cancelled.  Hedges have a bound of their
    own (a share of the requests sent, and a count in flight) outside ``max_inflight``, so a
    slow store is never hit with twice the load.  Ranged parts are hedged one by one.

    Requests in flight: an :class:`~asyncloader._base._budget.InflightBudget` with
    ``max_inflight`` as its ceiling (exactly ``max_inflight`` when not ``adaptive``).  Given
    ``decode_workers``, its need follows Little's law from the rate they decode at.  Given
    ``node`` (a file in the cache folder), it is one member of the node's shared budget
    (:class:`~asyncloader._base._node_share.NodeShare`); :meth:`close` leaves it.
    """

    def __init__(
        self,
        store: ObjectStore,
        counters: Counters,
        config: FetchConfig,
        *,
        decode_workers: int | None = None,
        node: str | os.PathLike[str] | None = None,
    ) -> None:
        self.store = store
        self.config = cfg = config.for_workers(usable_cpus())  # unless the caller sized it
        self._c = counters
        self._workers = decode_workers
        self._node: NodeShare | None = None
        if cfg.adaptive:
            if node is not None and cfg.node_budget:
                try:
                    self._node = NodeShare(node)
                except OSError as exc:  # a full or read-only cache disk: on its own, then
                    warnings.warn(
                        f"the in-flight budget is not shared with the node ({exc})",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            self.budget = InflightBudget(
                cfg.inflight,
                floor=cfg.min_inflight,
                decrease=cfg.throttle_decrease,
                headroom=cfg.inflight_headroom,
                rate=self._request_rate if decode_workers else None,
                node=self._node,
            )
        else:
            self.budget = InflightBudget(cfg.inflight, floor=cfg.inflight)
        self._rng = random.Random()
        # Whether the store honours Range (None: not known yet), learned from the first
        # ranged read, which goes alone (``_probe``, while others wait for its answer).
        self._ranges: bool | None = None
        self._probe: asyncio.Future[None] | None = None
        self._hedges_inflight = 0
        self._max_hedges_inflight = max(self.config.hedge_min_inflight, self.config.inflight // 16)

    def close(self) -> None:
        """Leave the node's shared budget (if any).  Idempotent."""
        node, self._node = self._node, None
        if node is not None:
            node.close()

    async def fetch(self, obj: ObjectInfo) -> Blob:
        """Return the object's bytes, verified against its listed size and ETag.

        An answer of the wrong length is asked for again (a retry), like a throttled or
        failed request; only one that persists fails.

        Raises:
            StoreError: after retries ran out (LengthMismatch for a length that stayed
                wrong), or at once for errors that are not transient (IntegrityError for a
                changed ETag, ObjectNotFound, AccessDenied, ...).
        """
        c = self._c
        size = obj.size
        if size == -1:
            # The listing has no such object (a metadata file or manifest named it): it is
            # missing as surely as a 404 would say, and is reported so without asking the
            # store, which may not be there (a run from a warm cache, offline).
            raise not_listed(self.store.url, obj.key)
        t0 = asyncio.get_running_loop().time()
        if size > self.config.range_threshold:
            data = await self._fetch_ranges(obj)
        else:
            data = await self._request(obj.key, 0, None, obj.etag, size if size >= 0 else None)
        c.objects_fetched += 1
        c.fetch_seconds += asyncio.get_running_loop().time() - t0
        return data

    async def _fetch_ranges(self, obj: ObjectInfo) -> Blob:
        """A large object in parts of ``part_size``, in parallel, where the store honours
        ``Range``; in one GET where it answers a range with the whole object (a 200: nginx
        with ``max_ranges 0``, many CDNs and proxies).  Which it does is learned once, from
        the first part of the first large object, asked for alone: a server that ignores
        ranges sends that object once, not once per part."""
        while self._ranges is None:
            probe = self._probe
            if probe is None:
                return await self._probe_ranges(obj)
            await asyncio.shield(probe)  # another object's first part is asking
        if not self._ranges:
            return await self._request(obj.key, 0, None, obj.etag, obj.size)
        return await self._parts(obj)

    async def _probe_ranges(self, obj: ObjectInfo) -> Blob:
        """``obj`` read by its first part alone, which tells whether the store honours
        ``Range``, then by the rest (or whole, as that part came)."""
        probe = self._probe = asyncio.get_running_loop().create_future()
        try:
            end = min(self.config.part_size, obj.size)
            first = await self._request(obj.key, 0, end, obj.etag, whole=obj.size)
            self._ranges = not whole_answer(first, 0, end, obj.size)
        finally:  # answered or failed (another object then asks again)
            self._probe = None
            probe.set_result(None)
        return await self._parts(obj, first) if self._ranges else first

    async def _parts(self, obj: ObjectInfo, first: Blob | None = None) -> Blob:
        """``obj``'s parts in parallel (but ``first``, had already).  A part that fails
        for good fails the object with that part's error, as a whole object's would (a
        missing object is skipped under ``on_error="skip"``, never the run's end)."""
        part = self.config.part_size
        buf = bytearray(obj.size)
        whole: list[Blob] = []

        async def one(start: int) -> None:
            end = min(start + part, obj.size)
            data = await self._request(obj.key, start, end, obj.etag, whole=obj.size)
            if whole_answer(data, start, end, obj.size):  # the server stopped honouring Range
                whole.append(data)
                raise _WholeObject
            buf[start:end] = data

        if first is not None:
            buf[: len(first)] = first
        try:
            # A TaskGroup cancels the other parts as soon as one fails for good.
            async with asyncio.TaskGroup() as tg:
                for start in range(len(first) if first is not None else 0, obj.size, part):
                    tg.create_task(one(start))
        except BaseExceptionGroup as group:
            if whole:
                self._ranges = False
                return whole[0]
            raise _first_store_error(group) from None
        return buf

    async def _request(
        self,
        key: str,
        start: int,
        end: int | None,
        etag: str,
        size: int | None = None,
        *,
        whole: int | None = None,
    ) -> Blob:
        """One object or range, retried; ``size``: the whole object's listed length, asked
        for whole; ``whole``: its length, a range asked for (the answer may be all of it)."""
        c = self._c

        budget = self.budget

        async def attempt() -> Blob:
            # One try holds an in-flight slot (its hedge does not); the backoff between
            # tries holds none.
            permit = await budget.acquire()
            answered = False
            try:
                if not self.config.hedge:
                    data = await self._one(key, start, end, etag, size, whole=whole)
                else:
                    data = await self._hedged(key, start, end, etag, size, whole=whole)
                answered = True
                return data
            finally:
                budget.release(permit, answered=answered)
                c.inflight_limit = budget.limit
                c.backoffs_followed = budget.followed
                c.node_loaders = budget.members if self._node is not None else 0

        def count(err: StoreError) -> None:
            c.retries[retry_reason(err)] += 1

        return await retrying(attempt, self.config, on_retry=count, rng=self._rng)

    async def _one(
        self,
        key: str,
        start: int,
        end: int | None,
        etag: str,
        size: int | None,
        *,
        whole: int | None = None,
        hedge: bool = False,
    ) -> Blob:
        """One request, counted, its answer's length checked and its latency learned.  A
        ``hedge`` holds no in-flight slot and is not counted in flight (``hedges_sent``)."""
        c = self._c
        loop = asyncio.get_running_loop()
        c.requests += 1
        held = 0 if hedge else 1
        c.inflight += held
        c.inflight_peak = max(c.inflight_peak, c.inflight)
        generation = self.budget.generation
        t0 = loop.time()
        try:
            data = await self.store.get(key, start=start, end=end, etag=etag)
        except Throttled:
            if self.budget.throttled(generation):
                c.backoffs += 1
                c.inflight_limit = self.budget.limit
            raise
        finally:
            c.inflight -= held
        c.bytes_fetched += len(data)
        if size is not None and len(data) != size:
            raise LengthMismatch(
                f"{shown_key(key)}: received {len(data)} bytes, listed size is {size}",
                key=key,
            )
        if whole is not None and end is not None and len(data) not in (end - start, whole):
            raise LengthMismatch(  # neither the range asked for nor the whole object
                f"{shown_key(key)}: received {len(data)} bytes for {end - start} of {whole}",
                key=key,
            )
        c.latency.add(loop.time() - t0)
        return data

    def _request_rate(self) -> float | None:
        """Requests per second the decode workers can absorb: the objects they decode per
        second of busy time, times the requests an object takes (ranges, retries)."""
        c = self._c
        if self._workers is None or c.decoded < 32 or c.decode_seconds <= 0:
            return None
        per_object = max(1.0, (c.requests - c.hedges_sent) / max(c.objects_fetched, 1))
        return self._workers * c.decoded / c.decode_seconds * per_object

    def _hedge_deadline(self) -> float | None:
        """How long a request may take before it is hedged; None: no hedging now."""
        cfg = self.config
        if not cfg.hedge or self._c.latency.count < cfg.hedge_min_samples:
            return None
        return max(cfg.hedge_floor, cfg.hedge_factor * self._c.latency.quantile(cfg.hedge_quantile))

    def _may_hedge(self) -> bool:
        c, cfg = self._c, self.config
        if self._hedges_inflight >= self._max_hedges_inflight or self.budget.pace > 0:
            return False  # (a store paced for its rate limit: a hedge is one request more)
        return c.hedges_sent < cfg.hedge_share * c.requests + cfg.hedge_min_inflight

    async def _hedged(
        self,
        key: str,
        start: int,
        end: int | None,
        etag: str,
        size: int | None,
        *,
        whole: int | None = None,
    ) -> Blob:
        """The request, and a second one if the first is not answered by the hedge
        deadline: the first complete, verified answer wins, the other is cancelled.

        The deadline is looked at again when it passes, not fixed when the request starts:
        requests sent before enough latencies were known can still be hedged.
        """
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = loop.create_task(self._one(key, start, end, etag, size, whole=whole))
        tasks = [first]
        timer: list[asyncio.TimerHandle] = []
        try:
            while True:
                # Wake at the first answer, or once the deadline has passed and a hedge is
                # allowed, whichever comes first (what asyncio.wait does with a timeout, at a
                # fraction of its cost).  While the hedges' bounds are reached, look again
                # every hedge_floor: a late request gets its hedge as soon as one is free.
                wake: asyncio.Future[None] = loop.create_future()
                first.add_done_callback(partial(_settle, wake))

                def check(wake: asyncio.Future[None] = wake) -> None:
                    deadline = self._hedge_deadline()
                    left = self.config.hedge_floor  # not enough latencies known yet
                    if deadline is not None:
                        left = t0 + deadline - loop.time()
                        if left <= 0 and not self._may_hedge():
                            left = self.config.hedge_floor
                    if left > 0:
                        timer[:] = [loop.call_later(left, check)]
                    else:
                        _settle(wake, None)

                timer[:] = [
                    loop.call_later(self._hedge_deadline() or self.config.hedge_floor, check)
                ]
                await wake
                if first.done():
                    return await first
                if self._may_hedge():
                    break  # (else another request took the last hedge meanwhile)
            c = self._c
            c.hedges_sent += 1
            self._hedges_inflight += 1
            second = loop.create_task(
                self._one(key, start, end, etag, size, whole=whole, hedge=True)
            )
            second.add_done_callback(self._hedge_done)
            tasks.append(second)
            pending: set[asyncio.Future[Blob]] = {first, second}
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        if task is second:
                            c.hedges_won += 1
                        return task.result()
                if not pending:
                    # Both failed: the first request's error decides (retried or not).
                    return first.result()
        finally:
            if timer:
                timer[0].cancel()
            for task in tasks:
                if task.done():  # an error this fetch did not look at (it was stopped)
                    _consume(task)
                else:
                    task.cancel()
                    task.add_done_callback(_consume)

    def _hedge_done(self, _task: asyncio.Future[Blob]) -> None:
        self._hedges_inflight -= 1


class _WholeObject(Exception):
    """A part was answered with the whole object: the other parts are not needed."""


def _first_store_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error of an object's failed parts to raise as the object's: the first store
    error among them (nested groups too), else the group itself."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            exc = _first_store_error(exc)
        if isinstance(exc, StoreError):
            return exc
    return group


def _settle(wake: asyncio.Future[None], _: object) -> None:
    if not wake.done():
        wake.set_result(None)


def _consume(task: asyncio.Future[Blob]) -> None:
    """Retrieve a request's outcome that nobody awaits (a cancelled loser, or one that failed
    as its fetch was stopped), so that its error is not logged when it is collected."""
    if not task.cancelled():
        task.exception()
