"""Where a loader's run stands: the epoch the next iteration runs, the next batch the
consumer has not seen, a resume waiting for its iteration, and the part of an epoch left to
deal after a resume on another world size.  Pure bookkeeping (no engine, no I/O); the
state dictionaries themselves are :mod:`._resume`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._base._config import RunConfig
from .._dataset._mix import Mix
from ._resume import loader_state, plan_resume

__all__ = ["Position"]

Span = tuple[int, int]


class Position:
    """A loader's place in its run.

    ``set_epoch`` chooses the next iteration's epoch; without it each iteration runs the
    one after the last (from 0).  ``begin`` says where an iteration starts, ``delivered``
    and ``finished`` follow the consumer, and ``state``/``load`` turn it into a state
    dictionary and back.
    """

    def __init__(self) -> None:
        self._requested: int | None = None
        self._last = -1
        self._at: tuple[int, int] | None = None  # (epoch, batch) the consumer sees next
        self._resume: tuple[int, int] | None = None  # from load(), for the next iteration
        # (epoch, start, end): that epoch deals only positions [start, end) of its order
        # (the rest of an epoch resumed with another world size).
        self._span: tuple[int, int, int] | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs."""
        return self._requested if self._requested is not None else self._last + 1

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        self._requested = epoch

    def reset(self) -> None:
        """A new engine produces epoch 0 from its first batch."""
        self._at = (0, 0)

    def begin(self) -> tuple[int, int, Span | None]:
        """``(epoch, first batch, span)`` of the iteration starting now."""
        epoch = self.epoch
        self._requested = None
        first = 0
        if self._resume is not None and self._resume[0] == epoch:
            first = self._resume[1]
        self._resume = None
        if self._span is not None and self._span[0] != epoch:
            self._span = None
        span = self._span[1:] if self._span is not None else None
        return epoch, first, span

    def delivered(self, epoch: int, index: int) -> None:
        """The consumer has batch ``index`` of ``epoch``."""
        self._at = (epoch, index + 1)

    def finished(self, epoch: int) -> None:
        """The consumer saw the whole of ``epoch``."""
        self._at = (epoch + 1, 0)
        self._last = epoch

    def lost(self) -> None:
        """The iteration failed: where the consumer stands is not known."""
        self._at = None

    def state(
        self,
        run: RunConfig,
        num_objects: int,
        mix: Mix | None = None,
        rank_samples: Callable[[int], int] | None = None,
    ) -> dict[str, Any]:
        """The state dictionary of this place (see :func:`~._resume.loader_state`);
        ``rank_samples``: the samples a rank sees in an epoch (a bucketed run's state needs
        it)."""
        if self._resume is not None:
            epoch, next_batch = self._resume
        elif self._requested is not None:
            epoch, next_batch = self._requested, 0
        else:
            epoch, next_batch = self._at or (self.epoch, 0)
        span = self._span[1:] if self._span and self._span[0] == epoch else None
        dealt = None
        if span is None and run.buckets is not None:
            assert rank_samples is not None, "a bucketed run's state needs its epoch's size"
            dealt = rank_samples(epoch) * run.world_size
        return loader_state(
            run,
            epoch=epoch,
            next_batch=next_batch,
            num_objects=num_objects,
            span=span,
            mix=mix,
            dealt=dealt,
        )

    def load(self, state: dict[str, Any], mine: dict[str, Any]) -> None:
        """Continue from ``state`` (``mine``: this loader's own state now, what it must
        agree with).

        Raises:
            ValueError: see :func:`~._resume.plan_resume`.
        """
        plan = plan_resume(state, mine)
        self._span = (plan.epoch, plan.span[0], plan.span[1]) if plan.span else None
        self._resume = (plan.epoch, plan.next_batch)
        self._requested = None
        self._last = plan.epoch - 1
