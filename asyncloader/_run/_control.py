"""What the loader asks of its engine, wherever the engine runs (:class:`Engine`), and the
messages between the training process and engine processes.

The loader (the training process's side) sees one surface: start an epoch, wait for the
next notice, lease a batch, the listing, the counters, close.  :class:`~._inline.InlineEngine`
serves it from an event-loop thread of this process; :class:`~._engines.EngineProcesses`
from engine processes that write into rings of shared memory, with one message per batch
each way (a notice out, a slot given back), never one per sample.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._base._stats import Counters
from .._base._types import ObjectInfo
from .._cache import ObjectCache
from .._dataset._labels import Dataset, LabelSpec
from .._device._ring import BatchRing
from ._notices import BatchReady, Notice

if TYPE_CHECKING:
    from .._device._upload import Uploader
    from ._build import LoaderPlan

__all__ = [
    "ASK_COUNTERS",
    "COUNTERS",
    "DATASET",
    "FAILED",
    "LISTED",
    "NOTICE",
    "READY",
    "SLOT",
    "START",
    "Engine",
    "EngineOrder",
]

# Engine -> trainer, on the engine's socket: (tag, ...).
READY = "ready"  # (READY, ring name, slots, dataset or None): built, producing epoch 0
# (LISTED, dataset, None) or (LISTED, None, error): a listing that grew while batches were
# made is complete, or failed.
LISTED = "listed"
NOTICE = "notice"  # (NOTICE, generation, Notice)
COUNTERS = "counters"  # (COUNTERS, Counters)
FAILED = "failed"  # (FAILED, error): the engine could not start
# Trainer -> engine, on the same socket; None asks it to stop.
START = "start"  # (START, generation, epoch, first batch, span)
DATASET = "dataset"  # (DATASET, dataset): the lead engine's listing, for the others
ASK_COUNTERS = "ask-counters"  # (ASK_COUNTERS,)
# Trainer -> engine on a pipe of its own: a ring slot given back, written by whichever thread
# drops the batch's last reference (one write, atomic, no lock: safe in a finaliser).
SLOT = struct.Struct("=i")


@dataclass(frozen=True, slots=True)
class EngineOrder:
    """What an engine process is told to do (pickled once, at its start).

    Attributes:
        plan: Its share of the loader's plan (decode workers, requests, ring slots).
        part: ``(k, n)``: it makes batches ``k, k + n, …`` of the rank's share.
        url, store_options: The store it opens (its own connections).
        labels, extensions: How the listing becomes samples.
        objects: The object list when the trainer has it (given, or the job's listing).
        await_dataset: Wait for the lead engine's dataset (:data:`DATASET`) instead of
            listing (every engine but the first, when the list is not known yet).
        folder: The SSD cache folder, or None; ``cache`` its handle.
        budget_folder: Where the node's fetch budget file lives (the cache folder, or a
            folder of the loader's own so that its engines share one budget).
        max_age: Age of a saved listing still used [seconds].
        stream: Batches may start while the store still lists (unshuffled, one engine).
        release_fd: The pipe the trainer gives slots back on.
    """

    plan: LoaderPlan
    part: tuple[int, int]
    url: str
    store_options: dict[str, Any]
    labels: LabelSpec
    extensions: Sequence[str] | None
    objects: Sequence[ObjectInfo] | None
    await_dataset: bool
    folder: str | None
    cache: ObjectCache | None
    budget_folder: str | None
    max_age: float
    stream: bool
    release_fd: int


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
