"""The engine in the training process (``EngineConfig(mode="inline")``): the event-loop
thread of a :class:`~._runtime.Runtime`, with the listing, fetch, cache fill, decode pool,
ring and pipeline built from one plan (:mod:`._build`).

It is also what each engine process runs (:mod:`._engine`), there with a share of the
batches (``part``) and its notices sent to the trainer instead of queued here.  The loader
talks to it, or to the engine processes (:mod:`._engines`), through the same surface
(:class:`~._control.Engine`).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .._base._errors import ClosedError, PipelineDeadError
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore
from .._dataset import Listing, open_listing, open_mixed_listing
from .._dataset._labels import Dataset
from .._device._ring import BatchRing
from .._stores._mixed import MixedStore
from ._build import LoaderPlan, loop_factory, make_fetcher, make_pipeline, make_pool, make_ring
from ._control import EngineShare, EngineSpec
from ._notices import BatchReady, Notice
from ._pipeline import Pipeline
from ._runtime import Runtime

if TYPE_CHECKING:
    import torch

    from .._device._upload import Uploader

__all__ = ["InlineEngine"]

T = TypeVar("T")


class InlineEngine:
    """The whole engine on an event-loop thread of this process.

    Args:
        p: The loader's plan.
        counters: Where the engine counts (the consumer's counters too, in this mode).
        output: Where batches are announced (default: a queue the consumer reads).
    """

    def __init__(
        self, p: LoaderPlan, counters: Counters, output: queue.Queue[Notice] | None = None
    ) -> None:
        self.plan = p
        self.counters = counters
        self.output: queue.Queue[Notice] = output if output is not None else queue.Queue()
        self.rt = Runtime(loop_factory(p.engine.event_loop))
        self.workers = p.workers
        self.dataset_given: Dataset | None = None

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the engine's loop and wait for it."""
        return self.rt.call(coro, timeout)

    def setup(
        self,
        store: ObjectStore,
        spec: EngineSpec,
        share: EngineShare | None = None,
        *,
        dataset: Dataset | None = None,
        listed: Callable[[Sequence[ObjectInfo]], None] | None = None,
        device: torch.device | None = None,
        start: tuple[int, int, tuple[int, int] | None] = (0, 0, None),
    ) -> None:
        """List (or take ``dataset``, the lead engine's), build every part of ``spec`` over
        ``store`` for ``share`` of the batches, and start producing: epoch 0 from its first
        batch, or ``start`` (epoch, first batch, span: see :meth:`Pipeline.start`).
        ``listed``: told the object list once complete; ``device``: the GPU of a GPU
        decode's ring.
        """
        self.rt.store = store
        c = self.counters
        p = self.plan
        share = share or EngineShare()
        part = share.part

        def done(objects: Sequence[ObjectInfo]) -> None:
            c.objects_listed = len(objects)
            c.listing_seconds = time.perf_counter() - t0
            if listed is not None:
                listed(objects)

        async def build() -> None:
            if dataset is not None:
                listing = Listing(dataset)
                c.objects_listed = len(dataset.samples)
            elif spec.sources:
                assert isinstance(store, MixedStore)
                listing = await open_mixed_listing(
                    store,
                    spec.sources,
                    spec.extensions,
                    folder=spec.folder,
                    max_age=spec.max_age,
                    listed=done,
                    extras=p.run.extras,
                    samples_per_epoch=p.run.samples_per_epoch,
                    objects=spec.objects,
                )
            else:
                listing, task = await open_listing(
                    store,
                    spec.labels,
                    spec.extensions,
                    folder=spec.folder,
                    max_age=spec.max_age,
                    stream=spec.stream,
                    listed=done,
                    objects=spec.objects,
                    store_options=spec.store_options,
                    extras=p.run.extras,
                    samples_per_epoch=p.run.samples_per_epoch,
                )
                self.rt.listing_task = task
            if listing.dataset is not None:
                c.unnamed_images = listing.dataset.unnamed
            self.rt.ring = ring = make_ring(p, device, attach=share.ring)
            c.ring_slots = ring.slots
            self.rt.pool = pool = await make_pool(p, ring)
            budget = share.budget_folder if share.budget_folder is not None else spec.folder
            fetcher = make_fetcher(store, c, p.fetch, budget, decode_workers=p.workers)
            self.rt.pipeline = pipeline = make_pipeline(
                p, listing, fetcher, pool, ring, c, self.output, spec.cache, part=part
            )
            # Captures the runtime, never the loader: the loader must stay collectable.
            rt = self.rt
            ring.on_release = lambda slot: rt.call_soon(pipeline.release, slot)
            if listing.done and part == (0, 1):
                pipeline.order.check()
            # Start right away: the first batches are ready when iteration begins.
            await pipeline.start(*start)

        t0 = time.perf_counter()
        self.rt.call(build())

    # --- the surface the loader uses (see _control.Engine) ------------------------------

    @property
    def closed(self) -> bool:
        return self.rt.closed

    @property
    def pipeline(self) -> Pipeline:
        pipeline = self.rt.pipeline
        if pipeline is None:
            raise ClosedError("the loader is closed")
        return pipeline

    @property
    def rings(self) -> list[BatchRing]:
        return [self.rt.ring] if self.rt.ring is not None else []

    def start(self, epoch: int, first: int, span: tuple[int, int] | None) -> None:
        self.rt.call(self.pipeline.start(epoch, first, span))

    def next_notice(self, timeout: float) -> Notice:
        """The next notice, in order.

        Raises:
            queue.Empty: none within ``timeout`` seconds.
            PipelineDeadError: the event-loop thread is gone.
        """
        try:
            return self.output.get(timeout=timeout)
        except queue.Empty:
            if not self.rt.thread.is_alive():
                raise PipelineDeadError("the event-loop thread died") from None
            raise

    def lease(self, ready: BatchReady) -> tuple[Any, np.ndarray[Any, Any]]:
        assert self.rt.ring is not None
        return self.rt.ring.lease(ready.slot, ready.n)

    def held_ring(self) -> BatchRing | None:
        """The ring the next batch needs a slot of."""
        return self.rt.ring

    def dataset(self) -> Dataset:
        """All samples (waits for the listing of an unshuffled run)."""
        listing = self.pipeline.listing
        return listing.dataset or self.rt.call(listing.complete())

    def epoch_samples(self) -> int:
        self.dataset()
        return self.pipeline.order.epoch_samples()

    def engine_counters(self) -> Counters:
        pool = self.rt.pool
        if pool is not None:
            self.counters.worker_restarts = pool.restarts
        return self.counters

    def ring_held(self) -> int:
        ring = self.rt.ring
        return ring.held if ring is not None else 0

    def set_uploader(self, uploader: Uploader) -> None:
        """Batches go on to ``uploader``, which is closed before the ring."""
        ring = self.rt.ring
        assert ring is not None
        uploader.prepare(ring.images)
        self.rt.uploader = uploader

    def close(self) -> None:
        self.rt.close()
