"""One engine on an event-loop thread of the process that holds it: the listing, fetch, cache
fill, decode pool, ring and pipeline built from one plan (:mod:`asyncloader._run._build`) on
a :class:`~asyncloader._run._runtime.Runtime`.

The training process holds one in the inline mode (``EngineConfig(mode="inline")``, and in
DataLoader workers), its notices on a queue here; each engine process holds one
(:mod:`._child`), with a share of the batches (``part``) and its notices sent to the
trainer.  Either way production restarts one way (:meth:`LocalEngine.restart`) and every
notice carries the generation it was made for.  The loader talks to it, or to the engine
processes (:mod:`._parent`), through the same surface (:class:`~._surface.Engine`).
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
from .._dataset import Listing, open_dataset
from .._dataset._labels import Dataset
from .._dataset._sizes import SizeReading
from .._device._ring import BatchRing
from .._run._build import (
    LoaderPlan,
    loop_factory,
    make_fetcher,
    make_pipeline,
    make_pool,
    make_ring,
)
from .._run._cache_fill import CacheHeads
from .._run._dist import StoreShare
from .._run._notices import BatchReady, Notice, Outbox
from .._run._pipeline import Pipeline
from .._run._runtime import Runtime
from ._surface import EngineShare, EngineSpec

if TYPE_CHECKING:
    import torch

    from .._device._upload import Uploader

__all__ = ["LocalEngine", "Notices"]

T = TypeVar("T")


class Notices:
    """The outbox of the engine in this process: a queue of ``(generation, notice)`` the
    consumer's thread reads (see :class:`~asyncloader._run._notices.Outbox`)."""

    def __init__(self) -> None:
        self.generation = 0  # set on the loop, where notices are put
        self.queue: queue.Queue[tuple[int, Notice]] = queue.Queue()

    def put(self, notice: Notice) -> None:
        self.queue.put((self.generation, notice))


class LocalEngine:
    """The whole engine on an event-loop thread of this process.

    Args:
        p: The loader's plan.
        counters: Where the engine counts (the consumer's counters too, in this mode).
        output: Where batches are announced (default: :class:`Notices`, which the consumer
            reads through :meth:`next_notice`).
    """

    def __init__(self, p: LoaderPlan, counters: Counters, output: Outbox | None = None) -> None:
        self.plan = p
        self.counters = counters
        self.output: Outbox = output if output is not None else Notices()
        self.rt = Runtime(loop_factory(p.engine.event_loop))
        self.workers = p.workers
        self._generation = 0  # of the last start asked for here

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
        batch, or ``start`` (epoch, first batch, span: see :meth:`Pipeline.start`), for
        the outbox's generation as it stands.  ``listed``: told the object list once
        complete; ``device``: the GPU of a GPU decode's ring.
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
            else:
                listing, task = await open_dataset(
                    store,
                    spec.sources,
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
                    filters=p.run.filters,
                    counters=c,
                    sizes=SizeReading(
                        wanted=p.run.buckets is not None,
                        skip=p.run.errors.on_error == "skip",
                        share=StoreShare(spec.job) if spec.job is not None else None,
                        cached=(
                            CacheHeads(cache, scaled=p.cache.scaled_jpegs)
                            if (cache := p.object_cache)
                            else None
                        ),
                        upright=p.spec.exif_orientation,
                    ),
                )
                self.rt.listing_task = task
            if listing.dataset is not None:
                c.unnamed_images = listing.dataset.unnamed
                c.filtered_out = listing.dataset.filtered
            self.rt.ring = ring = make_ring(p, device, attach=share.ring)
            c.ring_slots = ring.slots
            self.rt.pool = pool = make_pool(p, ring)
            budget = share.budget_folder if share.budget_folder is not None else spec.folder
            fetcher = make_fetcher(store, c, p.fetch, budget, decode_workers=p.workers)
            self.rt.pipeline = pipeline = make_pipeline(
                p, listing, fetcher, pool, ring, c, self.output, part=part, ring_key=share.serial
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

    async def restart(
        self, generation: int, epoch: int, first: int, span: tuple[int, int] | None
    ) -> None:
        """On the loop: production restarts at ``epoch``/``first`` (``span``: positions of
        its order left to deal) for ``generation``.  What the old production announces
        until it has stopped carries the old generation: the consumer's side drops it and
        gives its slots back."""
        pipeline = self.pipeline
        await pipeline.stop()
        self.output.generation = generation
        await pipeline.start(epoch, first, span)

    def start(self, epoch: int, first: int, span: tuple[int, int] | None) -> None:
        self._generation += 1
        self.call(self.restart(self._generation, epoch, first, span))

    def next_notice(self, timeout: float) -> Notice:
        """The next notice of the last start, in order (older ones are dropped, their slots
        given back).

        Raises:
            queue.Empty: none within ``timeout`` seconds.
            PipelineDeadError: the event-loop thread is gone.
        """
        assert isinstance(self.output, Notices)  # the trainer's engine, not a process's
        deadline = time.monotonic() + timeout
        while True:
            try:
                generation, notice = self.output.queue.get(
                    timeout=max(deadline - time.monotonic(), 0)
                )
            except queue.Empty:
                if not self.rt.thread.is_alive():
                    raise PipelineDeadError("the event-loop thread died") from None
                raise
            if generation == self._generation:
                return notice
            if isinstance(notice, BatchReady):  # made before the last start
                self.rt.call_soon(self.pipeline.release, notice.slot)

    def tend(self) -> None:
        """Nothing to replace: the loop thread's death is :meth:`next_notice`'s to tell."""

    def lease(self, ready: BatchReady) -> tuple[Any, np.ndarray[Any, Any]]:
        assert self.rt.ring is not None
        return self.rt.ring.lease(ready.slot, ready.n, ready.shape)

    def held_ring(self) -> BatchRing | None:
        """The ring the next batch needs a slot of."""
        return self.rt.ring

    def dataset(self) -> Dataset:
        """All samples (waits for the listing of an unshuffled run)."""
        listing = self.pipeline.listing
        return listing.dataset or self.rt.call(listing.complete())

    def epoch_samples(self, epoch: int = 0) -> int:
        self.dataset()
        return self.pipeline.order.epoch_samples(epoch)

    def engine_counters(self) -> Counters:
        # GPU decode in this process: its pool knows the GPU's hardware JPEG engines.
        engines = getattr(self.rt.pool, "engines", None)
        if engines is not None:
            self.counters.gpu_engines = engines
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
