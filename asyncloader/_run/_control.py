"""What the loader asks of its engine, wherever the engine runs (:class:`Engine`), and the
messages between the training process and engine processes.

The loader (the training process's side) sees one surface: start an epoch, wait for the
next notice, lease a batch, the listing, the counters, close.  :class:`~._inline.InlineEngine`
serves it from an event-loop thread of this process; :class:`~._engines.EngineProcesses`
from engine processes that write into rings of shared memory, with one message per batch
each way (a notice out, a slot given back), never one per sample.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._base._shm import SegmentRef
from .._base._sources import Source
from .._base._stats import Counters
from .._base._types import ObjectInfo
from .._base._wire import CrossedError, Message
from .._cache import ObjectCache
from .._dataset._labels import Dataset, LabelSpec
from .._device._ring import BatchRing
from ._notices import BatchReady, EpochEnd, Notice

if TYPE_CHECKING:
    from .._device._upload import Uploader
    from ._build import LoaderPlan

__all__ = [
    "SLOT",
    "AskCounters",
    "Counts",
    "Engine",
    "EngineOrder",
    "EngineReady",
    "EngineShare",
    "EngineSpec",
    "Listed",
    "NoEngine",
    "OrderNotPicklable",
    "Produced",
    "ProductionFailed",
    "StartEpoch",
    "TakeDataset",
    "close_engine",
]

# The engine's messages (see _base/_wire.py for the shape every child protocol shares):
#
#   trainer                                   engine k
#     │── EngineOrder (launch) ──────────────────►│ lists (the lead) or waits for
#     │── TakeDataset (to k > 0, unless known) ──►│   the lead's dataset
#     │◄──────── EngineReady | ChildFailed ───────│ built, producing epoch 0 (or
#     │                                           │   where its order's start says)
#     │◄──────── Listed (the lead, if it grew) ───│
#     │── StartEpoch ────────────────────────────►│ restarts production
#     │◄──────── Produced | ProductionFailed ─────│ one per batch, epoch end, failure
#     │── AskCounters ───────────────────────────►│
#     │◄──────── Counts ──────────────────────────│
#     │── Stop ──────────────────────────────────►│ tears down
#     │◄──────── Counts (final) ──────────────────│ exits; EOF: gone
#
# Slots go back on a pipe of their own, not the socket: SLOT, 4 bytes, written by whichever
# thread drops a batch's last reference (one write, atomic, no lock: safe in a finaliser).
SLOT = struct.Struct("=i")


@dataclass(frozen=True, slots=True)
class TakeDataset(Message):
    """Trainer → engine ``k > 0``: the lead engine's listing, instead of listing again."""

    dataset: Dataset


@dataclass(frozen=True, slots=True)
class StartEpoch(Message):
    """Trainer → engine: make ``epoch`` from batch ``first`` on (``span``: positions of its
    order left to deal); what it makes from now on carries ``generation``."""

    generation: int
    epoch: int
    first: int
    span: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class AskCounters(Message):
    """Trainer → engine: send your counters."""


@dataclass(frozen=True, slots=True)
class EngineReady(Message):
    """Engine → trainer: built and producing into the ring the trainer made for it;
    ``dataset``: the lead's listing when complete already."""

    dataset: Dataset | None


@dataclass(frozen=True, slots=True)
class Listed(Message):
    """Engine (the lead) → trainer: a listing that grew while batches were made is complete
    (``dataset``), or failed (``error``)."""

    dataset: Dataset | None
    error: CrossedError | None


@dataclass(frozen=True, slots=True)
class Produced(Message):
    """Engine → trainer: a batch ready, or an epoch's end, made for ``generation``."""

    generation: int
    notice: BatchReady | EpochEnd


@dataclass(frozen=True, slots=True)
class ProductionFailed(Message):
    """Engine → trainer: production for ``generation`` stopped with ``error``."""

    generation: int
    error: CrossedError


@dataclass(frozen=True, slots=True)
class Counts(Message):
    """Engine → trainer: its counters (asked for, or the final ones as it stops)."""

    counters: Counters


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What an engine reads and how, wherever it runs: :meth:`InlineEngine.setup
    <._inline.InlineEngine.setup>` builds every part from it (in this process, or in each
    engine process with its :class:`EngineShare`).

    Attributes:
        plan: The loader's plan (an engine process's share of it: :func:`split_plan`).
        url, store_options: The store (each engine process opens its own connections).
        labels, extensions: How the listing becomes samples.
        objects: The object list when known already (given, or the job's listing).
        cache: The SSD cache, or None.
        stream: Batches may start while the store lists (unshuffled, one engine, no ranks'
            agreement to check first).
        sources: Several sources (``url`` then names them all): their URLs, weights,
            labels and store options; None for one.
    """

    plan: LoaderPlan
    url: str
    store_options: dict[str, Any]
    labels: LabelSpec
    extensions: Sequence[str] | None
    objects: Sequence[ObjectInfo] | None
    cache: ObjectCache | None
    stream: bool
    sources: tuple[Source, ...] | None = None

    @property
    def folder(self) -> str | None:
        """The cache's folder (saved listings, the node's fetch budget), or None."""
        return self.cache.directory if self.cache is not None else None

    @property
    def max_age(self) -> float:
        """Age of a saved listing still used [seconds]."""
        return self.plan.cache.max_age


@dataclass(frozen=True, slots=True)
class EngineShare:
    """One engine's share of its loader's work.

    Attributes:
        part: ``(k, n)``: it makes batches ``k, k + n, …`` of this worker's (see
            :func:`~._sampler.batch_owner`).
        budget_folder: Where the fetch budget is shared (None: the cache folder's, if any).
        ring: The ring it fills, made by the trainer, which hands out its batches (an
            engine process's; None: it makes its own).
    """

    part: tuple[int, int] = (0, 1)
    budget_folder: str | None = None
    ring: SegmentRef | None = None


@dataclass(frozen=True, slots=True)
class EngineOrder:
    """What an engine process is told to do (pickled once, at its start).

    Attributes:
        spec: What it reads and how (its share of the plan).
        share: Its share of the batches, and where its budget and ring live.
        await_dataset: Wait for the lead engine's dataset (:class:`TakeDataset`) instead of
            listing (every engine but the first, when the list is not known yet).
        release_fd: The pipe the trainer gives slots back on.
        start: Where production starts, and the generation it is made for (a replacement
            starts where its dead predecessor stopped); None: epoch 0 from its first batch.
    """

    spec: EngineSpec
    share: EngineShare
    await_dataset: bool
    release_fd: int
    start: StartEpoch | None = None

    @classmethod
    def parts(
        cls, spec: EngineSpec, plans: Sequence[LoaderPlan], budget_folder: str | None
    ) -> list[EngineOrder]:
        """The orders of ``len(plans)`` engine processes sharing ``spec``: engine ``k`` its
        plan and its batches; all but the first wait for the lead's dataset unless the
        objects are known; streaming with one engine only.  Each names its slot pipe and
        ring when it is pickled (:meth:`pickled`)."""
        n = len(plans)
        return [
            cls(
                spec=replace(spec, plan=plans[k], stream=spec.stream and n == 1),
                share=EngineShare(part=(k, n), budget_folder=budget_folder),
                await_dataset=k > 0 and spec.objects is None,
                release_fd=-1,
            )
            for k in range(n)
        ]

    def pickled(self, release_fd: int, ring: SegmentRef) -> bytes:
        """This order for the engine that reads its slots from ``release_fd`` and fills
        ``ring``, pickled.

        Raises:
            OrderNotPicklable: an option cannot be sent to an engine process.
        """
        order = replace(self, release_fd=release_fd, share=replace(self.share, ring=ring))
        try:
            return pickle.dumps(order)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise OrderNotPicklable(str(exc)) from exc


class OrderNotPicklable(Exception):
    """An option of the loader (a hook, a labels function) cannot go to another process."""


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
        """The next notice in batch order.

        Raises:
            queue.Empty: none within ``timeout`` seconds.
            PipelineDeadError: the engine is gone.
        """

    def lease(self, ready: BatchReady) -> tuple[Any, np.ndarray[Any, Any]]:
        """The batch's images and labels, holding its slot until both are gone."""

    def held_ring(self) -> BatchRing | None:
        """The ring the next batch needs a free slot of."""

    def dataset(self) -> Dataset:
        """All samples (waits for a listing still growing)."""

    def epoch_samples(self) -> int:
        """Samples per epoch of this rank (waits for the listing)."""

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
