"""What the pipeline announces to the consumer, in order, on its output queue: a batch ready
in a ring slot, the end of an epoch, or the failure that stopped production."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchReady", "EpochEnd", "Failed", "Notice", "Skipped"]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A batch's samples left out under ``on_error="skip"``: how many of each error type,
    and their keys (as messages show them)."""

    counts: Counter[str] = field(default_factory=Counter)
    keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchReady:
    """Batch ``index`` of ``epoch`` is in ring ``slot``: its first ``n`` samples; ``skipped``
    maps error type → samples of it left out, ``skipped_keys`` names them (counted when it
    is delivered); ``ring``: which engine process's ring (0 in the engine's own process);
    ``extras``: each extra's values for the ``n`` samples (``extras=``), else None;
    ``sources``: how many of them each source gave (several sources), else None."""

    epoch: int
    index: int
    slot: int
    n: int
    skipped: Counter[str]
    skipped_keys: tuple[str, ...] = ()
    ring: int = 0
    extras: dict[str, list[Any]] | None = None
    sources: dict[str, int] | None = None


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
