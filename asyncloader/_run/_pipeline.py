"""The asyncio flow: sampler → fetcher → decode pool → batch ring → output queue.

Everything here runs on the loader's one event loop, and no torch; with a cache, the index
queries run on one thread of their own (in batch order) and fetched bytes go to the cache's
writer thread.  Bounds: ``max_inflight`` requests, a window of fetched-but-undecoded
objects, and the ring's slots (a batch is only started once a slot is free, so when the
consumer stops taking batches, decode, fetch and listing all wait).

Batches are published in order; each is the samples ``indices[b*B:(b+1)*B]`` of the epoch,
so the same seed and epoch give the same batches however the work interleaves.  Work is
also *done* in batch order where it queues: a batch's decode jobs carry its place in the
stream as their priority, and its index query answers before a later batch's.  After the
last batch of an epoch the next epoch starts at once (its first batches are in flight before
the consumer has finished the current one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .._base._config import RunConfig
from .._base._errors import AsyncLoaderError, shown_key
from .._base._stats import Counters
from .._base._types import CachedAt, CacheEvent, DecodeJob, Outcome, Sample
from .._dataset import Listing
from .._decode import DecodePool
from .._device._ring import BatchRing
from .._fetch import Fetcher
from ._batches import BatchOrder, Geometry, Mark, batch_geometry
from ._cache_fill import CacheFill, InHand, OnceFetcher
from ._extras import BatchExtras, ExtrasReader
from ._notices import BatchReady, EpochEnd, Failed, Failure, Outbox, SampleFailures, Skipped
from ._sampler import sample_seeds

__all__ = ["Pipeline"]

T = TypeVar("T")


_Filled = tuple[int, Skipped, "BatchExtras | None", dict[str, int] | None, tuple[int, int] | None]
"""A batch made: how many of its samples, those left out, their extras, their sources, its
shape (a bucketed batch's)."""


async def _next(it: AsyncIterator[T]) -> T:
    return await anext(it)


class Pipeline:
    """Produces batches into the ring and announces them to ``output``.

    Args:
        listing: The samples (complete, or still growing for an unshuffled run).
        fetcher: Fetches object bytes.
        pool: Decodes into ring slots.
        ring: The batch buffers.
        run: Batch composition and error policy.
        counters: Stats, written from the loop.
        output: Where finished batches are announced (stamped with the generation: the
            consumer's side drops what an earlier start made).
        decode_window: Most samples between the start of their fetch and the end of their
            decode (bounds the bytes held in memory).
        filling: The way into the SSD cache (:class:`~._cache_fill.CacheFill`), which
            decides what is kept and how: hits are read by decode workers, fetched bytes
            written back, each object fetched once while other batches need it.
        part: ``(k, n)``: make only every ``n``-th of this worker's batches, from its
            ``k``-th on (the share of one of ``n`` engine processes); ``(0, 1)``: all.
        ring_key: How its notices name ``ring`` (an engine process's serial; 0 here).
    """

    def __init__(
        self,
        listing: Listing,
        fetcher: Fetcher,
        pool: DecodePool,
        ring: BatchRing,
        run: RunConfig,
        counters: Counters,
        output: Outbox,
        *,
        decode_window: int,
        filling: CacheFill | None = None,
        part: tuple[int, int] = (0, 1),
        ring_key: int = 0,
    ) -> None:
        self.listing = listing
        self.order = BatchOrder(listing, run, part)
        self.fetcher = fetcher
        self.pool = pool
        self.ring = ring
        self.run = run
        self.counters = counters
        self.output = output
        self._ring_key = ring_key
        self._decode_window = decode_window
        self._filling = filling
        dataset = listing.dataset
        self._mix = dataset.mix if dataset is not None else None
        self._geometry = Geometry.of(run, dataset, self.order.bucket_of)
        self._extras = (
            ExtrasReader(dataset.extras, fetcher, filling, counters, self._geometry)
            if dataset is not None and dataset.extras is not None
            else None
        )
        self._free: asyncio.Queue[int] = asyncio.Queue()
        # Slots published and not yet given back: announced on `output`, or delivered and
        # still referenced by the consumer's batch (the ring tells, through `release`).
        self._out: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self._window = asyncio.Semaphore(decode_window)
        self._failures = SampleFailures(run.errors)
        # Each batch's place in the stream: its decode jobs' priority, so that a batch's
        # samples are decoded before a later batch's (cache hits of the next epoch, ready at
        # once, would otherwise hold up the end of this one).
        self._seq = 0

    def close_threads(self) -> None:
        """Write what the cache writer holds, then stop it and the index thread (blocks:
        call off the loop)."""
        if self._filling is not None:
            self._filling.close()

    # --- control (called on the loop) ---------------------------------------------------

    async def start(
        self, epoch: int, first_batch: int = 0, span: tuple[int, int] | None = None
    ) -> None:
        """(Re)start producing at batch ``first_batch`` of ``epoch``, dropping anything made.
        ``span``: deal only positions ``[start, end)`` of that epoch's order among the
        ranks (the rest of an epoch resumed with another world size).

        Objects fetched before are in the cache by then (or failed to be): a restarted
        epoch reads them from disk.
        """
        await self.stop()
        if self._filling is not None:
            await self._filling.prepare()
        # Nothing is filling any slot now.  Slots published before stay out until they come
        # back (:meth:`release`): batches the consumer still references when it lets go,
        # batches announced and never taken when the consumer's side drops their stale
        # notice (an earlier generation) and gives the slot back.
        self._free = asyncio.Queue()
        self.ring.limit = self.order.slots_for(self.ring.slots)
        for s in range(self.ring.limit):
            if s not in self._out:
                self._free.put_nowait(s)
        self.counters.ring_out = len(self._out)
        self._window = asyncio.Semaphore(self._decode_window)
        self._task = asyncio.create_task(
            self._run(epoch, first_batch, span), name=f"asyncloader-epoch-{epoch}"
        )

    async def stop(self) -> None:
        """Cancel production and wait until no decode job can still write into a slot."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        drain = getattr(self.pool, "drain", None)
        if drain is not None:
            await drain()

    def release(self, slot: int) -> None:
        """The last reference to the batch in ``slot`` is gone (called on the loop)."""
        if slot in self._out:
            self._out.remove(slot)
            self.counters.ring_out = len(self._out)
            if slot < self.ring.limit:
                self._free.put_nowait(slot)

    async def _decode(self, job: DecodeJob, seq: int) -> Outcome:
        c = self.counters
        c.decode_queue += 1
        try:
            return await self.pool.decode(job, seq)
        finally:
            c.decode_queue -= 1

    def _account(self, outcome: Outcome, size: int = 0) -> None:
        self.counters.count_decode(outcome, size=size, caching=self._filling is not None)

    # --- production ---------------------------------------------------------------------

    async def _run(self, epoch: int, first_batch: int, span: tuple[int, int] | None) -> None:
        # One stream of batches across epochs: the next epoch's first batches start while
        # the current epoch's last ones are still in flight (no bubble at the boundary).
        inflight: deque[tuple[int, int, bool, int, asyncio.Task[_Filled]]] = deque()
        self._failures.reset()
        batches = self.order.batches(epoch, first_batch, span)
        nxt: (
            asyncio.Task[tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64], bool]] | None
        ) = None
        try:
            while True:
                nxt = asyncio.create_task(_next(batches))
                # While the next batch cannot start yet (its samples are still being
                # listed), publish the batches that finish meanwhile.
                while not nxt.done() and inflight:
                    await asyncio.wait((nxt, inflight[0][4]), return_when=asyncio.FIRST_COMPLETED)
                    while inflight and inflight[0][4].done():
                        await self._publish(*inflight.popleft())
                ep, b, sel, places, last = await nxt
                nxt = None
                if b < 0:  # this worker has nothing left in `ep` (a resume past its end)
                    while inflight:
                        await self._publish(*inflight.popleft())
                    self.output.put(EpochEnd(ep))
                    continue
                # Publish finished batches in order: the head when it is done, and the head
                # (waiting for it) when no slot is free to start another batch.
                while inflight and (inflight[0][4].done() or self._free.empty()):
                    await self._publish(*inflight.popleft())
                slot = await self._free.get()
                task = asyncio.create_task(self._fill(slot, ep, sel, places, self._seq))
                self._seq += 1
                inflight.append((ep, b, last, slot, task))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.output.put(Failed(exc))
        finally:
            if nxt is not None:
                nxt.cancel()
                with contextlib.suppress(BaseException):
                    await nxt
            await batches.aclose()
            for *_, t in inflight:
                t.cancel()
            for *_, t in inflight:
                with contextlib.suppress(BaseException):
                    await t

    async def _publish(
        self,
        epoch: int,
        index: int,
        last: bool,
        slot: int,
        task: asyncio.Task[_Filled],
    ) -> None:
        n, skipped, extras, sources, shape = await task
        self.counters.batches_produced += 1
        self._out.add(slot)
        self.counters.ring_out = len(self._out)
        self.output.put(
            BatchReady(
                epoch=epoch,
                index=index,
                ring=self._ring_key,
                slot=slot,
                n=n,
                skipped=skipped.counts,
                skipped_keys=skipped.keys,
                extras=extras,
                sources=sources,
                shape=shape,
            )
        )
        # A budget that is a fraction of the epoch waits for a growing listing to complete.
        samples = self.order.epoch_samples(epoch) if self.listing.done else None
        self._failures.check(epoch, samples, last)
        if last:
            self.output.put(EpochEnd(epoch))

    async def _fill(
        self,
        slot: int,
        epoch: int,
        sel: np.ndarray[Any, Any],
        places: np.ndarray[Any, Any],
        seq: int,
    ) -> _Filled:
        """Fill ``slot`` with the samples ``sel`` at ``places`` of the epoch's order (batch
        ``seq`` of the stream); returns how many made it, why not, and their extras
        (sidecars are fetched beside the images)."""
        # Each sample made once per batch (a compact sample list makes one per access).
        batch = [self.listing.samples[int(i)] for i in sel]
        cached: dict[str, CachedAt | None] = {}
        keys = [""] * len(sel)
        fill = self._filling
        if fill is not None:
            keys, early, cached = await fill.look_up(self.fetcher.store, batch)
        else:
            early = {}
        hits = [j for j in range(len(sel)) if keys[j] in cached]
        hit_set = set(hits)
        shape, marks = batch_geometry(self._geometry, sel.tolist())
        seeds = sample_seeds(self.run.seed, epoch, places)
        one = partial(self._sample, slot, epoch, seq)
        hit_results, side, *fetched = await asyncio.gather(
            self._hits(slot, epoch, seq, batch, hits, keys, cached, seeds, marks),
            self._side(epoch, sel, seeds),
            *(
                one(j, seeds[j], batch[j], keys[j], early.get(keys[j]), marks[j])
                for j in range(len(sel))
                if j not in hit_set
            ),
            return_exceptions=True,
        )
        for res in (hit_results, side):
            if isinstance(res, BaseException):
                raise res  # "raise" policy, or a bug
        assert isinstance(hit_results, dict)
        assert isinstance(side, tuple)
        extras, side_failed = side
        rest = iter(fetched)
        results: list[BaseException | None] = []
        for j in range(len(sel)):
            res = hit_results[j] if j in hit_set else next(rest)
            results.append(res if isinstance(res, BaseException) else None)
        for res in results:
            if res is not None and not isinstance(res, Failure):
                raise res  # "raise" policy, or a bug: the run stops with it
        for j, failure in side_failed.items():
            results[j] = results[j] or failure
        failed = [j for j, res in enumerate(results) if res is not None]
        if failed:
            gone = set(failed)
            keep = [j for j in range(len(sel)) if j not in gone]
            n = len(keep)
            if n:
                # Compact the survivors to the front, in order (a short, deterministic batch).
                self.ring.compact(slot, keep, shape)
            if extras is not None:
                extras = {name: [v[j] for j in keep] for name, v in extras.items()}
            skipped = Counter(type(res.__cause__).__name__ for res in results if res is not None)
            named = tuple(shown_key(batch[j].obj.key) for j in failed)
            return n, Skipped(skipped, named), extras, self._count(sel[keep]), shape
        return len(sel), Skipped(), extras, self._count(sel), shape

    def _count(self, sel: np.ndarray[Any, Any]) -> dict[str, int] | None:
        """How many of the samples ``sel`` each source gave (several sources only)."""
        mix = self._mix
        return mix.count(sel) if mix is not None and len(mix.urls) > 1 else None

    async def _side(
        self, epoch: int, sel: np.ndarray[Any, Any], seeds: list[int]
    ) -> tuple[BatchExtras | None, dict[int, BaseException]]:
        """The batch's extras (``seeds``: its samples'), and the samples whose sidecar
        failed (none asked: none)."""
        if self._extras is None:
            return None, {}
        return await self._extras.batch(
            sel.tolist(), seeds, lambda exc, key: self._failures.failed(exc, epoch, "sidecar", key)
        )

    async def _hits(
        self,
        slot: int,
        epoch: int,
        seq: int,
        batch: list[Sample],
        hits: list[int],
        keys: list[str],
        cached: dict[str, CachedAt | None],
        seeds: list[int],
        marks: list[Mark | None],
    ) -> dict[int, BaseException | None]:
        """Decode a batch's cache hits as one group: no task, window permit or future per
        sample.  Entries evicted since the index query go the fetch path after all.  Returns
        each hit's failure (``Failure`` under "skip"), or None."""
        out: dict[int, BaseException | None] = {}
        if not hits:
            return out
        c = self.counters
        jobs = []
        for j in hits:
            obj = batch[j].obj
            at = cached[keys[j]]
            jobs.append(DecodeJob(at, slot, j, seeds[j], obj.key, keys[j], obj.size, marks[j]))
        c.decode_queue += len(jobs)
        try:
            outcomes = await self.pool.decode_many(jobs, seq)
        finally:
            c.decode_queue -= len(jobs)
        gone = []
        for j, outcome in zip(hits, outcomes, strict=True):
            sample = batch[j]
            if isinstance(outcome, BaseException):
                out[j] = self._failures.failed(outcome, epoch, "cache", sample.obj.key)
                continue
            if outcome.events & CacheEvent.MISS:  # evicted or damaged since the index check
                self._account(outcome)
                gone.append(j)
                continue
            self._account(outcome, sample.obj.size)
            self.ring.labels[slot, j] = sample.label
            out[j] = None
        if gone:
            one = partial(self._sample, slot, epoch, seq)
            again = await asyncio.gather(
                *(one(j, seeds[j], batch[j], keys[j], None, marks[j]) for j in gone),
                return_exceptions=True,
            )
            out.update(zip(gone, again, strict=True))
        return out

    async def _sample(
        self,
        slot: int,
        epoch: int,
        seq: int,
        j: int,
        seed: int,
        sample: Sample,
        cache_key: str,
        early: InHand | None = None,
        mark: Mark | None = None,
    ) -> None:
        """Fetch one sample, then decode it into ``slot`` (storing it in the cache).
        ``early``: its bytes, or their fetch, in hand before the batch's index query."""
        obj = sample.obj
        stage = "fetch"
        try:
            async with self._window:
                # Fetched by another batch and not yet in the index: a hit on the cache's
                # bytes in memory, not a second GET.
                once = self._filling.once if self._filling is not None else None
                if early is None and once is not None:
                    early = once.in_hand(cache_key)
                    if early is None and once.written_lately(cache_key):
                        # Written after this batch's index query: read from the cache.
                        stage = "cache"
                        job = DecodeJob(None, slot, j, seed, obj.key, cache_key, obj.size, mark)
                        outcome = await self._decode(job, seq)
                        del job
                        if not outcome.events & CacheEvent.MISS:
                            self._account(outcome, obj.size)
                            self.ring.labels[slot, j] = sample.label
                            return
                        self._account(outcome)  # evicted since: fetched after all
                        stage = "fetch"
                data = await OnceFetcher.shared(early) if early is not None else None
                hit = CacheEvent.HIT if data is not None else CacheEvent.NONE
                if data is None:
                    fetch = self.fetcher.fetch(obj) if once is None else once.fetch(obj, cache_key)
                    data = await fetch
                stage = "decode"
                job = DecodeJob(data, slot, j, seed, obj.key, "", obj.size, mark)
                del data  # the job holds the bytes until the worker is done with them
                outcome = await self._decode(job, seq)
                del job
                if hit:
                    outcome = Outcome(outcome.busy, outcome.events | hit, outcome.path)
                self._account(outcome, obj.size)
            self.ring.labels[slot, j] = sample.label
        except AsyncLoaderError as exc:
            raise self._failures.failed(exc, epoch, stage, obj.key) from exc
