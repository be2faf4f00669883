"""What the pipeline announces to the consumer, in order, to its outbox: a batch ready in a
ring slot, the end of an epoch, or the failure that stopped production; and the outbox,
which stamps each notice with the generation (the consumer's latest start) it was made for,
so that the consumer's side drops what an earlier start made, in one place.  Also what
makes a ``Skipped`` count and a ``Failed`` notice: the samples that fail, raised or counted
against the epoch's budget (:class:`SampleFailures`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._base._config import ErrorConfig
from .._base._errors import AsyncLoaderError, FailureBudgetExceeded, shown_key

__all__ = [
    "BatchReady",
    "EpochEnd",
    "Failed",
    "Failure",
    "Notice",
    "Outbox",
    "SampleFailures",
    "Skipped",
]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A batch's samples left out under ``on_error="skip"``: how many of each error type,
    and their keys (as messages show them)."""

    counts: Counter[str] = field(default_factory=Counter)
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchReady:
    """Batch ``index`` of ``epoch`` is in ``slot`` of ``ring``: its first ``n`` samples.

    Attributes:
        ring: Which ring: the serial its engine process was given by the trainer that maps
            its ring (set by the engine, which knows it from its order); 0 for the engine
            in the trainer.
        skipped: Error type → samples of it left out under ``on_error="skip"`` (counted
            when the batch is delivered); ``skipped_keys`` names them.
        extras: Each extra's values for the ``n`` samples (``extras=``), else None.
        sources: How many of them each source gave (several sources), else None.
        shape: A bucketed batch's ``(height, width)``, else None (the ring's sample shape).
    """

    epoch: int
    index: int
    ring: int
    slot: int
    n: int
    skipped: Counter[str] = field(default_factory=Counter)
    skipped_keys: tuple[str, ...] = ()
    extras: dict[str, list[Any]] | None = None
    sources: dict[str, int] | None = None
    shape: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """This worker's share of ``epoch`` is complete."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Failed:
    """Production stopped with ``error`` (a failure under ``on_error="raise"``, a failure
    budget exceeded, or a bug)."""

    error: BaseException


Notice = BatchReady | EpochEnd | Failed
"""What the pipeline announces on its output queue, in order."""


class Outbox(Protocol):
    """Where a pipeline announces its notices: a queue of this process, or the socket to
    the trainer.  Each notice goes out stamped with :attr:`generation`, which the engine
    sets on its loop when it restarts production, between the old production's end and
    the new one's start."""

    generation: int

    def put(self, notice: Notice) -> None:
        """Announce ``notice``, stamped with the generation now (never blocks)."""


class Failure(Exception):
    """A per-sample failure already counted; carries the original exception."""


class SampleFailures:
    """The failures of the epochs in production (on the engine's loop)."""

    def __init__(self, errors: ErrorConfig) -> None:
        self.errors = errors
        self._by_epoch: dict[int, list[Exception]] = {}

    def reset(self) -> None:
        """Production starts again: nothing counted."""
        self._by_epoch = {}

    def failed(self, exc: BaseException, epoch: int, stage: str, key: str) -> Failure:
        """A sample failed: raise under "raise" (and for bugs), else count it for "skip"."""
        if not isinstance(exc, AsyncLoaderError):
            raise exc
        exc.add_note(f"asyncloader: stage={stage} key={shown_key(key)}")
        if self.errors.on_error == "raise":
            raise exc
        self._by_epoch.setdefault(epoch, []).append(exc)
        failure = Failure()
        failure.__cause__ = exc
        return failure

    def check(self, epoch: int, samples: int | None, last: bool) -> None:
        """After a batch of ``epoch`` (of ``samples``; None: not known yet) is published;
        ``last``: its last one, which forgets the epoch.

        Raises:
            FailureBudgetExceeded: more failures than the budget allows.
        """
        failures = self._by_epoch.get(epoch, [])
        if len(failures) > self.errors.budget(samples):
            raise FailureBudgetExceeded.of(failures, epoch, samples, self.errors.max_failures)
        if last:
            self._by_epoch.pop(epoch, None)
