"""What the loader asks of its engine, wherever the engine runs (:class:`Engine`), and what
an engine is made from (:class:`EngineSpec`, :class:`EngineShare`).

The loader (the training process's side) sees one surface: start an epoch, wait for the
next notice, lease a batch, the listing, the counters, close.  :class:`~._local.LocalEngine`
serves it from an event-loop thread of this process; :class:`~._parent.EngineProcesses`
from engine processes that write into rings of shared memory, with one message per batch
each way (a notice out, a slot given back, :mod:`._wire`), never one per sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._base._config import decode_window, ring_slots
from .._base._jobstore import StoreAddress
from .._base._shm import SegmentRef
from .._base._sources import Source
from .._base._stats import Counters
from .._base._types import ObjectInfo
from .._dataset._labels import Dataset, LabelSpec
from .._device._ring import BatchRing
from .._run._build import LoaderPlan, ship_arena
from .._run._notices import BatchReady, Notice

if TYPE_CHECKING:
    from .._device._upload import Uploader

__all__ = [
    "Engine",
    "EngineShare",
    "EngineSpec",
    "NoEngine",
    "close_engine",
    "engine_ring",
    "split_plan",
]


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What an engine reads and how, wherever it runs: :meth:`LocalEngine.setup
    <._inline.LocalEngine.setup>` builds every part from it (in this process, or in each
    engine process with its :class:`EngineShare`).

    Attributes:
        plan: The loader's plan (an engine process's share of it: :func:`~._parent.split_plan`).
        url, store_options: The store (each engine process opens its own connections).
        labels, extensions: How the listing becomes samples.
        objects: The object list when known already (given, or the job's listing).
        stream: Batches may start while the store lists (unshuffled, one engine, no ranks'
            agreement to check first).
        sources: Several sources (``url`` then names them all): their URLs, weights,
            labels and store options; None for one.
        job: The job's store, where there is one: the images' sizes (buckets, size
            filters) are read by one process of the job and shared there.
    """

    plan: LoaderPlan
    url: str
    store_options: dict[str, Any]
    labels: LabelSpec
    extensions: Sequence[str] | None
    objects: Sequence[ObjectInfo] | None
    stream: bool
    sources: tuple[Source, ...] | None = None
    job: StoreAddress | None = None

    @property
    def folder(self) -> str | None:
        """The cache's folder (saved listings, the node's fetch budget), or None."""
        cache = self.plan.object_cache
        return cache.directory if cache is not None else None

    @property
    def max_age(self) -> float:
        """Age of a saved listing still used [seconds]."""
        return self.plan.cache.max_age


@dataclass(frozen=True, slots=True)
class EngineShare:
    """One engine's share of its loader's work.

    Attributes:
        part: ``(k, n)``: it makes batches ``k, k + n, …`` of this worker's (see
            :func:`~asyncloader._run._sampler.batch_owner`).
        budget_folder: Where the fetch budget is shared (None: the cache folder's, if any).
        ring: The ring it fills, made by the trainer, which hands out its batches (an
            engine process's; None: it makes its own).
        serial: Which ring it fills, as its notices name it: the trainer's serial of this
            engine process (replacements counted); 0 for the engine in the trainer.
    """

    part: tuple[int, int] = (0, 1)
    budget_folder: str | None = None
    ring: SegmentRef | None = None
    serial: int = 0


class Engine(Protocol):
    """What the loader needs of its engine.

    Attributes:
        workers: Decode workers in all.
    """

    workers: int

    @property
    def closed(self) -> bool: ...

    def start(self, epoch: int, first: int, span: tuple[int, int] | None) -> None:
        """Make ``epoch`` from batch ``first`` on (``span``: positions of its order left to
        deal), dropping whatever was made and not yet taken."""

    def next_notice(self, timeout: float) -> Notice:
        """The next notice in batch order (of the last start: what an earlier start made
        is dropped here, its slots given back).

        Raises:
            queue.Empty: none within ``timeout`` seconds.
            PipelineDeadError: the engine is gone.
        """

    def tend(self) -> None:
        """Supervise: replace an engine process that died, where that is allowed (the
        consumer calls it each time no notice came within its slice).

        Raises:
            PipelineDeadError: an engine died and cannot be replaced.
        """

    def lease(self, ready: BatchReady) -> tuple[Any, np.ndarray[Any, Any]]:
        """The batch's images and labels, holding its slot until both are gone."""

    def held_ring(self) -> BatchRing | None:
        """The ring the next batch needs a free slot of (its slots in use as the engine
        that fills it set them)."""

    def dataset(self) -> Dataset:
        """All samples (waits for a listing still growing)."""

    def epoch_samples(self, epoch: int = 0) -> int:
        """Samples this rank sees in ``epoch`` (the same in every epoch but for a bucketed
        mix's; waits for the listing)."""

    def engine_counters(self) -> Counters:
        """The engine's counters (summed over engine processes)."""

    def ring_held(self) -> int:
        """Slots held by batches handed out."""

    def set_uploader(self, uploader: Uploader) -> None:
        """Batches go on to ``uploader`` (its pages registered; closed before the rings)."""

    def close(self) -> None:
        """Stop everything; idempotent."""


class NoEngine:
    """The engine before one is made (a loader whose construction failed has this one)."""

    workers = 0
    closed = True

    def close(self) -> None:
        pass


def close_engine(engine: Any) -> None:
    """Close ``engine`` (a finaliser's target: it must not hold the loader)."""
    engine.close()


def engine_ring(p: LoaderPlan) -> BatchRing:
    """The ring of an engine process of plan ``p`` (its share of the loader's), made by the
    trainer, which hands out its batches; the engine maps it."""
    shape = p.spec.sample_shape
    return BatchRing(p.slots, p.run.batch_size, shape, shared=True, arena=ship_arena(p))


def split_plan(p: LoaderPlan, n: int) -> list[LoaderPlan]:
    """``p`` for each of ``n`` engine processes: each makes every n-th batch with its share
    of the decode workers, of the requests in flight and of the ring's slots.  One engine
    gets the loader's ring; of several, each gets its work in flight plus 2 (one ahead, one
    held by the trainer: consecutive batches come from different engines), at least 3."""
    plans = []
    for k in range(n):
        workers = max(1, p.workers // n + (k < p.workers % n))
        inflight = max(1, p.fetch.inflight // n + (k < p.fetch.inflight % n))
        fetch = dataclasses.replace(p.fetch, max_inflight=inflight)
        given = p.engine.prefetch_batches
        slots = max(2, -(-given // n)) if given else ring_slots(None, inflight, p.run.batch_size)
        plans.append(
            dataclasses.replace(
                p,
                workers=workers,
                fetch=fetch,
                slots=slots,
                window=decode_window(inflight, workers),
            )
        )
    return plans
