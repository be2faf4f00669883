"""The sync consumer of an engine: the user's thread waits for the next batch in short
slices and checks liveness each time, so the end of an epoch, a dead engine, a closed loader,
a time-out and a consumer that holds every ring slot are different outcomes, each with its
own message; batches come out as tensor views of their ring slot.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._base._errors import AsyncLoaderError, BatchesHeldError, ClosedError, PipelineDeadError
from .._base._lifecycle import HELD_GRACE, WAIT_SLICE
from .._base._stats import Counters, Stats
from .._base._types import ObjectInfo
from .._run._dist import Agreement
from .._run._notices import BatchReady, EpochEnd, Failed, Notice
from .._run._position import Position
from ._surface import Engine

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "Consumer", "Superseded"]

Batch = (
    tuple["torch.Tensor", "torch.Tensor"]
    | tuple["torch.Tensor", "torch.Tensor", dict[str, list[Any]]]
)
"""What a loader yields: ``(images, labels)``, or ``(images, labels, extras)`` with
``extras=`` (each extra's values, one per sample, in batch order)."""
Meta = tuple[int, int, dict[str, list[Any]]]
"""A batch's index, its sample count and its extras, beside its tensors."""


class Superseded(AsyncLoaderError):
    """An iteration of a loader asked for a batch after a newer iteration of the same
    loader had started: a loader is one stream of batches, and only its newest iteration
    goes on (the older ones sharing it would each miss some batches, and see others
    twice)."""


class Consumer:
    """The consumer's side of ``engine``: batches in order, and the counters of both.

    Args:
        engine: Makes the batches.
        counters: The consumer's counters (the inline engine's too).
        url: Names the store in messages.
        timeout: No batch for this long is an error (None: wait) [seconds].
        max_inflight: The requests in flight allowed (for the stats).
        cpu_budget: Where the decode worker count came from, in words (for the stats).
        agreement: The ranks' agreement on the object list, in a sharded job.
        unchecked: The list to check with it before the first batch (or set later, once
            listed: ``unchecked``).
        extras: Batches carry extras (``extras=``): they are ``(images, labels, extras)``.

    Attributes:
        produced: Where the engine's output stands: ``(epoch, next batch, span)``, or None
            when not known (it is restarted where the consumer asks next).
    """

    def __init__(
        self,
        engine: Engine,
        counters: Counters,
        *,
        url: str,
        timeout: float | None,
        max_inflight: int,
        cpu_budget: str = "",
        agreement: Agreement | None = None,
        unchecked: Sequence[ObjectInfo] | None = None,
        extras: bool = False,
    ) -> None:
        self._engine = engine
        self._extras = extras
        self._agreement = agreement
        self.unchecked = unchecked
        self._counters = counters
        self._url = url
        self._timeout = timeout
        self._max_inflight = max_inflight
        self._cpu_budget = cpu_budget
        self.produced: tuple[int, int, tuple[int, int] | None] | None = (0, 0, None)
        # The newest iteration's number: an older one takes no notice of the engine's once
        # a newer has started (the lock orders the start against every take).
        self._iteration = 0
        self._turn = threading.Lock()

    def deliver(
        self,
        epoch: int,
        batches: Iterator[tuple[torch.Tensor, torch.Tensor, Any]],
        position: Position,
    ) -> Iterator[Batch]:
        """What the user receives of ``batches`` (of ``epoch``): counted, and followed by
        ``position``; before the run's first batch, the ranks' agreement on the list."""
        c = self._counters
        try:
            agreement = self._agreement
            if agreement is not None and self.unchecked is not None:
                agreement.check(self.unchecked)  # before the first batch of the run
                self.unchecked = None
            while True:
                if agreement is not None:
                    agreement.poll()  # a rank that refused later stops this one too
                try:
                    images, labels, (index, n, extras) = next(batches)
                except StopIteration:
                    break
                position.delivered(epoch, index)
                c.consumer_batches += 1
                c.consumer_samples += n
                if c.consumer_first_batch_seconds is None:
                    c.consumer_first_batch_seconds = time.perf_counter() - c.started
                # No reference stays in this frame while it waits at `yield`: a batch the
                # consumer drops must give its slot back then, not at the next request.
                batch: list[Batch] = [
                    (images, labels, extras) if self._extras else (images, labels)
                ]
                del images, labels, extras
                yield batch.pop()
        except (GeneratorExit, Superseded):
            raise  # the consumer stopped early, or a newer iteration goes on: it stands
        except BaseException:
            position.lost()
            raise
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        position.finished(epoch)

    def stats(self) -> Stats:
        """A snapshot of every counter, and which stage bounds the run."""
        engine = self._engine
        counters = engine.engine_counters().with_consumer(self._counters)
        return counters.snapshot(
            decode_workers=engine.workers,
            max_inflight=self._max_inflight,
            ring_held=engine.ring_held(),
            cpu_budget=self._cpu_budget,
        )

    def batches(
        self, epoch: int, first: int, span: tuple[int, int] | None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, Meta]]:
        """The producer's side: batches of the ring as tensor views, each holding its slot
        until the last reference to it is gone (see :meth:`BatchRing.lease`)."""
        import torch

        engine = self._engine
        with self._turn:  # this is now the newest iteration
            self._iteration += 1
            mine = self._iteration
            if self.produced != (epoch, first, span):
                engine.start(epoch, first, span)
                self.produced = (epoch, first, span)
        c = self._counters
        while True:
            notice = self._next_notice(mine, epoch, span)
            if isinstance(notice, EpochEnd):
                return
            if isinstance(notice, Failed):
                exc = notice.error
                if isinstance(exc, AsyncLoaderError):
                    raise exc
                raise PipelineDeadError(f"the pipeline failed: {exc!r}") from exc
            ready: BatchReady = notice
            del notice
            if ready.skipped:
                c.count_skipped(ready.skipped, ready.skipped_keys)
            if ready.sources:
                c.by_source.update(ready.sources)
            # Yielded straight from the call: no local of this frame keeps the batch.
            meta = (ready.index, ready.n, ready.extras or {})
            yield _as_tensors(*engine.lease(ready), meta, torch.from_numpy)

    def _next_notice(self, mine: int, epoch: int, span: tuple[int, int] | None) -> Notice:
        """The engine's next notice for iteration ``mine`` (of ``epoch`` and ``span``), in
        short waits; :attr:`produced` follows it.

        Raises:
            Superseded: a newer iteration has started.
        """
        c = self._counters
        engine = self._engine
        t0 = time.perf_counter()
        all_held_since: float | None = None
        try:
            while True:
                try:
                    with self._turn:
                        if self._iteration != mine:
                            raise Superseded(
                                "this iteration of the loader was superseded by a newer "
                                "iteration (iter(loader) again, or another for loop over it, "
                                "in this thread or another): a loader is one stream of "
                                "batches, and only its newest iteration goes on. Finish or "
                                "drop one iteration before starting the next, or use a "
                                "second loader"
                            )
                        notice = engine.next_notice(WAIT_SLICE)
                        self.produced = _after(notice, epoch, span)
                        return notice
                except queue.Empty:
                    if engine.closed:
                        raise ClosedError("the loader is closed") from None
                    engine.tend()  # an engine process that died is replaced here
                    now = time.perf_counter()
                    if self._timeout is not None and now - t0 > self._timeout:
                        raise AsyncLoaderError(
                            f"no batch from {self._url} within {self._timeout} s\n"
                            + self.stats().summary()
                        ) from None
                    ring = engine.held_ring()
                    if ring is None or ring.held < ring.limit:
                        all_held_since = None
                    elif all_held_since is None:
                        # Batches caught in reference cycles are only freed by a collection.
                        all_held_since = now
                        gc.collect()
                    elif now - all_held_since > HELD_GRACE:
                        raise BatchesHeldError(
                            f"all {ring.limit} ring slots hold batches that are still "
                            "referenced, so the next batch cannot be made. A batch is a view "
                            "of its slot (no copy) until the last reference to it is gone: "
                            "keep copies of batches you keep (images.clone()), drop the ones "
                            "you are done with, or raise EngineConfig(prefetch_batches=) "
                            f"(now {ring.slots})"
                        ) from None
        finally:
            c.consumer_wait_seconds += time.perf_counter() - t0


def _after(
    notice: Notice, epoch: int, span: tuple[int, int] | None
) -> tuple[int, int, tuple[int, int] | None] | None:
    """Where the engine's output stands once ``notice`` (of ``epoch`` and ``span``) is
    taken: see :attr:`Consumer.produced`."""
    if isinstance(notice, EpochEnd):
        return (epoch + 1, 0, None)
    if isinstance(notice, Failed):
        return None
    return (epoch, notice.index + 1, span)


def _as_tensors(
    images: Any, labels: Any, meta: Meta, from_numpy: Callable[[Any], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, Meta]:
    if not isinstance(images, np.ndarray):  # a ring on the device: a tensor already
        return images, from_numpy(labels), meta
    return from_numpy(images), from_numpy(labels), meta
