"""What the loader asks of its engine, wherever the engine runs (:class:`Engine`), and the
messages between the training process and engine processes.

The loader (the training process's side) sees one surface: start an epoch, wait for the
next notice, lease a batch, the listing, the counters, close.  :class:`~._inline.InlineEngine`
serves it from an event-loop thread of this process; :class:`~._engines.EngineProcesses`
from engine processes that write into rings of shared memory, with one message per batch
each way (a notice out, a slot given back), never one per sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._base._stats import Counters
from .._dataset._labels import Dataset
from .._device._ring import BatchRing
from ._notices import BatchReady, Notice

if TYPE_CHECKING:
    from .._device._upload import Uploader

__all__ = ["Engine"]


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
