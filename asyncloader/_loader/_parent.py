"""Engine processes, the training process's side (``EngineConfig(mode="process")``).

The loader's engine runs in ``n`` processes (:mod:`._child`): engine ``k`` fetches, caches
and decodes batches ``k, k + n, …`` of the rank's share into a ring of shared memory made
here.  Here, in the training process, only this runs:

* a reader thread (:mod:`._reader`); :meth:`EngineProcesses.next_notice`, which hands the
  batches out in order: batch ``b`` comes from engine ``b % n``, and each batch's notice
  names the ring it is in (its engine's serial, set by the engine from its order);
* leases on the mapped rings: when a batch's last reference goes, its slot goes back to its
  engine as four bytes on a pipe (from whichever thread dropped it);
* counters gathered from the engines when ``stats()`` asks;
* supervision (:meth:`EngineProcesses.tend`, called by the consumer each time it finds no
  batch ready): an engine that died (killed by the out-of-memory killer, say) is replaced
  once the trainer has taken every notice it sent, by a new engine process that starts
  where its stream stopped (the epoch and batch after the last notice taken, for the same
  start), so the epoch goes on and every sample arrives once, in the seed's order.  Its
  ring is freed once its batches are let go; an engine only maps what the trainer made, so
  nothing else of it is left.  At most ``EngineConfig.max_restarts`` per epoch.

A notice made before the last start carries an older generation: it is dropped here, the
one place stale batches are dropped, and its slot given back.  Nothing here runs per
sample.  Engines stop when asked (``close()``), and by themselves when the training
process is gone (their socket ends).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._base import _lifecycle as life
from .._base._errors import ClosedError, PipelineDeadError
from .._base._shm import SegmentRef
from .._base._stats import Counters
from .._dataset._labels import Dataset
from .._dataset._sizes import bucket_index
from .._device._ring import BatchRing
from .._run._notices import BatchReady, EpochEnd, Failed, Notice
from .._run._sampler import batch_owner, samples_per_epoch
from ._launch import stop_children
from ._link import EVERY_GENERATION, EngineLink
from ._reader import Reader
from ._surface import EngineSpec, engine_ring, split_plan
from ._wire import AskCounters, EngineOrder, Listed, Message, StartEpoch, Stop, TakeDataset

if TYPE_CHECKING:
    from .._device._upload import Uploader

__all__ = ["EngineProcesses"]

log = logging.getLogger("asyncloader")

Start = tuple[int, int, "tuple[int, int] | None"]
"""Where production was last started: epoch, first batch, span left to deal."""


@dataclass
class _Replaced:
    """The engines replaced so far: how many per epoch (bounded), the dead ones' links
    (their rings mapped until close) and what they had counted."""

    most: int
    per_epoch: dict[int, int] = field(default_factory=dict)
    links: list[EngineLink] = field(default_factory=list)
    counted: list[Counters] = field(default_factory=list)

    def admit(self, old: EngineLink, epoch: int) -> int:
        """One more replacement in ``epoch``, for ``old``: how many it makes.

        Raises:
            PipelineDeadError: ``old`` failed before it died (that failure was delivered),
                or it is one death too many this epoch.
        """
        if old.failed is not None:
            raise old.died("while running")
        deaths = self.per_epoch.get(epoch, 0)
        if deaths >= self.most:
            more = (
                f"engine processes replaced in epoch {epoch} so far: {deaths}, the most "
                f"EngineConfig(max_restarts={self.most}) allows; "
                if self.most
                else ""
            )
            raise old.died("while running", more)
        self.per_epoch[epoch] = deaths + 1
        return deaths + 1

    def retire(self, old: EngineLink) -> None:
        """``old`` is replaced: its counts kept as it last reported them."""
        self.links.append(old)
        if old.last_counts is not None:
            self.counted.append(old.last_counts.of_the_dead())

    def with_counts_of(self, parts: list[Counters]) -> Counters:
        """``parts`` (the live engines' counters) summed with the replaced engines'."""
        out = Counters.merged(parts + self.counted)
        out.engine_restarts = len(self.links)
        return out


class _Listing:
    """The loader's dataset as the lead engine lists it: known at its start, or once a
    listing that grew is complete (or failed)."""

    def __init__(self) -> None:
        self.dataset: Dataset | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def settle(self, dataset: Dataset | None, error: BaseException | None = None) -> None:
        self.dataset, self.error = dataset, error
        self.done.set()


class EngineProcesses:
    """The loader's engine in ``n`` processes (see the module's docstring).

    Args:
        spec: What the engines read and how (its plan split among them; streaming while
            the store lists with one engine only).
        n: Engine processes.

    Raises:
        OrderNotPicklable: an option cannot be sent to an engine process.
        AsyncLoaderError, ValueError: the engine could not start (its error, as the local
            engine would raise it: a listing that failed, an empty dataset).
    """

    def __init__(self, spec: EngineSpec, n: int) -> None:
        p = spec.plan
        self.workers = p.workers
        self._n = n
        self._run = p.run
        self._closed = False
        self._counts: dict[int, int] = {}  # samples per epoch (a bucketed mix's differ)
        self._lock = threading.Lock()  # sends on the engines' sockets
        self._generation = 0
        self._start: Start = (0, 0, None)  # of the generation
        self._epoch = 0  # the epoch the trainer takes batches of
        self._expect = self._first_of(0)  # the next batch of the current generation
        # Once an engine ended an epoch: (epoch, engines that still owe their end).
        self._owed: tuple[int, set[int]] | None = None
        self._listing = _Listing()
        self._final = Counters()  # the engines' counts when they stopped
        self._uploader: Uploader | None = None
        self._replaced = _Replaced(p.engine.max_restarts)
        self._rings: dict[int, BatchRing] = {}  # by the serial of the engine that fills it
        self._serials = itertools.count()
        self._engines: list[EngineLink] = []
        self._budget_folder = None
        if n > 1 and spec.folder is None:
            # The engines of one loader share one fetch budget, as the loaders of a node do
            # through their cache folder.
            self._budget_folder = tempfile.mkdtemp(prefix="asyncloader-budget-")
        self._plans = split_plan(p, n)
        self._orders = EngineOrder.parts(spec, self._plans, self._budget_folder)
        # The rings and slot pipes first: each order names its pipe's end and its ring's
        # descriptor as the engine sees them (the same numbers), so every order is pickled
        # once; a ring that does not fit, or an order that cannot be pickled, is known
        # before any process starts.
        rings: list[BatchRing] = []
        pipes: list[tuple[int, int]] = []
        try:
            for plan in self._plans:
                rings.append(engine_ring(plan))
            pipes = [os.pipe() for _ in range(n)]
            serials = [next(self._serials) for _ in range(n)]
            pickled = [
                self._orders[k].pickled(pipes[k][0], _ref(rings[k]), serials[k]) for k in range(n)
            ]
        except BaseException:
            _close_unlaunched(pipes, rings)
            self._remove_budget_folder()
            raise
        self._reader = Reader(self._heard_listed, self._fail)
        try:
            for k in range(n):
                r, w = pipes.pop(0)
                self._join(EngineLink.launch(k, serials[k], pickled[k], r, w, rings.pop(0)))
            lead = self._engines[0].wait_ready()
            if spec.objects is None and n > 1:
                assert lead.dataset is not None
                for e in self._engines[1:]:
                    self._send(e, TakeDataset(lead.dataset))
            for e in self._engines[1:]:
                e.wait_ready()
            if lead.dataset is not None:
                self._listing.settle(lead.dataset)
        except BaseException:
            _close_unlaunched(pipes, rings)
            self.close()
            raise

    def _join(self, e: EngineLink) -> None:
        """``e`` is engine ``e.k`` from now on (launched; its messages read from now, its
        ring's batches handed out)."""
        if e.k < len(self._engines):
            self._engines[e.k] = e
        else:
            self._engines.append(e)
        self._rings[e.serial] = e.ring
        if self._uploader is not None:
            self._uploader.prepare(e.ring.images)
        self._reader.add(e)

    # --- messages -----------------------------------------------------------------------

    def _heard_listed(self, out: Listed) -> None:
        """On the reader thread: the lead's listing that grew is complete, or failed."""
        self._listing.settle(out.dataset, out.error.rebuild() if out.error else None)

    def _fail(self, e: EngineLink, error: BaseException) -> None:
        """Engine ``e`` cannot go on (see :meth:`EngineLink.fail`); the lead's failure is
        the listing's too."""
        e.fail(error)
        if e.k == 0 and not self._listing.done.is_set():
            self._listing.settle(None, error)

    def _send(self, e: EngineLink, msg: Message) -> None:
        with self._lock:
            e.send(msg)

    # --- the surface the loader uses (see _surface.Engine) ------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def processes(self) -> int:
        return self._n

    def start(self, epoch: int, first: int, span: tuple[int, int] | None) -> None:
        if self._closed:
            raise ClosedError("the loader is closed")
        self._generation += 1
        self._start = (epoch, first, span)
        self._epoch = epoch
        self._expect = self._first_of(first)
        self._owed = None
        for e in self._engines:
            # A dead engine misses this start: its replacement starts here instead.
            e.position = (epoch, first)
            self._send(e, StartEpoch(self._generation, epoch, first, span))

    def _first_of(self, first: int) -> int:
        """The first batch from ``first`` on that is this DataLoader worker's."""
        r = self._run
        return first + (r.shard.worker - first) % r.shard.num_workers

    def _owner(self, index: int) -> int:
        return batch_owner(index, self._run.shard.num_workers, self._n)[1]

    def next_notice(self, timeout: float) -> Notice:
        deadline = time.monotonic() + timeout
        while True:
            if self._owed is not None:
                # Batch `_expect` does not exist: every engine ends this epoch.  Take their
                # ends (their next epoch's notices stay queued behind).
                epoch, owed = self._owed
                for k in sorted(owed):
                    notice = self._take(k, deadline)
                    if isinstance(notice, Failed):
                        return notice
                    if not isinstance(notice, EpochEnd):
                        raise PipelineDeadError(
                            f"engine process {k} sent {notice!r} after the end of epoch {epoch}"
                        )
                    owed.discard(k)
                self._owed = None
                self._expect = self._first_of(0)
                self._epoch = epoch + 1
                return EpochEnd(epoch)
            k = self._owner(self._expect)
            notice = self._take(k, deadline)
            if isinstance(notice, BatchReady):
                if notice.index != self._expect:
                    raise PipelineDeadError(
                        f"engine process {k} sent batch {notice.index}, not {self._expect}"
                    )
                self._expect += self._run.shard.num_workers
                return notice
            if isinstance(notice, EpochEnd):
                self._owed = (notice.epoch, {x for x in range(self._n) if x != k})
                continue
            return notice  # Failed

    def _take(self, k: int, deadline: float) -> Notice:
        """Engine ``k``'s next notice of the current generation (older ones are dropped,
        their slots given back).

        Raises:
            queue.Empty: none before ``deadline`` (an engine that died is replaced by
                :meth:`tend`, not here).
        """
        e = self._engines[k]
        while True:
            generation, notice = e.notices.get(timeout=max(deadline - time.monotonic(), 0))
            if generation in (self._generation, EVERY_GENERATION):
                e.took(notice)
                return notice
            if isinstance(notice, BatchReady):
                e.give_back(notice.slot)  # made before the last start

    def tend(self) -> None:
        """Replace every engine that died once the trainer has taken all it sent.

        Raises:
            PipelineDeadError: an engine died and may not be replaced (it failed first, it
                is one death too many this epoch), or its replacement could not start.
        """
        if self._closed:
            raise ClosedError("the loader is closed")
        for old in list(self._engines):
            if old.gone and old.notices.empty():
                self._replace(old)

    def _replace(self, old: EngineLink) -> None:
        """A new engine process for ``old``, which died, starting where its stream stopped
        (see the module's docstring)."""
        deaths = self._replaced.admit(old, self._epoch)
        ending = old.retire(keep_ring=self._uploader is not None)
        self._replaced.retire(old)
        epoch, first = old.position
        span = self._start[2] if epoch == self._start[0] else None
        listed = self._listing.dataset
        give = self._orders[old.k].spec.objects is None and listed is not None
        order = replace(
            self._orders[old.k],
            await_dataset=give,
            start=StartEpoch(self._generation, epoch, first, span),
        )
        ring = engine_ring(self._plans[old.k])
        r, w = os.pipe()
        serial = next(self._serials)
        try:
            pickled = order.pickled(r, _ref(ring), serial)
        except BaseException:
            _close_unlaunched([(r, w)], [ring])
            raise
        new = EngineLink.launch(old.k, serial, pickled, r, w, ring)
        new.position = old.position
        self._join(new)
        if give:
            assert listed is not None
            self._send(new, TakeDataset(listed))
        ready = new.wait_ready()
        if ready.dataset is not None and not self._listing.done.is_set():
            self._listing.settle(ready.dataset)
        log.warning(
            "asyncloader: %s while running; a new engine process (pid %d) goes on from batch "
            "%d of epoch %d (%d of at most %d replaced this epoch)",
            ending,
            new.proc.pid,
            first,
            epoch,
            deaths,
            self._replaced.most,
        )

    def lease(self, ready: BatchReady) -> tuple[Any, np.ndarray[Any, Any]]:
        return self._rings[ready.ring].lease(ready.slot, ready.n, ready.shape)

    def held_ring(self) -> BatchRing | None:
        """The ring of the engine whose batch is next (its slots in use, as its engine set
        them)."""
        return self._engines[self._owner(self._expect)].ring

    def dataset(self) -> Dataset:
        while not self._listing.done.wait(0.1):
            if self._closed:
                raise ClosedError("the loader is closed")
            lead = self._engines[0]
            if lead.gone and not lead.notices.empty():  # batches not taken: it cannot go on
                raise lead.died("while listing")
            self.tend()
        if self._listing.error is not None:
            raise self._listing.error
        assert self._listing.dataset is not None
        return self._listing.dataset

    def epoch_samples(self, epoch: int = 0) -> int:
        buckets = self._run.buckets
        key = epoch if buckets is not None else 0  # the same in every epoch otherwise
        if key not in self._counts:  # a bucketed one regroups the whole epoch: once
            dataset = self.dataset()
            bucket_of = bucket_index(dataset, buckets) if buckets is not None else None
            self._counts[key] = samples_per_epoch(
                len(dataset.samples), self._run, dataset.mix, buckets=bucket_of, epoch=key
            )
        return self._counts[key]

    def engine_counters(self) -> Counters:
        """The engines' counters, summed (an engine that does not answer within
        ``COUNTERS_REPLY`` is left out; one that died, not replaced yet, counts what it
        last sent, without waiting), with what replaced engines had counted."""
        if self._closed:
            return self._final
        engines = list(self._engines)
        for e in engines:
            while not e.replies.empty():  # late answers to an earlier question
                e.replies.get_nowait()
            self._send(e, AskCounters())
        deadline = time.monotonic() + life.COUNTERS_REPLY
        parts = [c for e in engines if (c := e.counters_by(deadline)) is not None]
        return self._replaced.with_counts_of(parts)

    def ring_held(self) -> int:
        return sum(ring.held for ring in self._rings.values())

    def set_uploader(self, uploader: Uploader) -> None:
        for e in self._engines:
            uploader.prepare(e.ring.images)
        self._uploader = uploader

    def close(self) -> None:
        """Ask every engine to stop, wait for them (then terminate, then kill), close the
        uploader and the rings' mappings (each freed once no batch references it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        engines = self._engines + self._replaced.links
        for e in self._engines:
            if not e.gone:
                with contextlib.suppress(OSError, ValueError):
                    e.conn.send(Stop())
        stop_children([e.proc for e in engines], life.ENGINE_GRACE, life.KILL_STEP)
        reader = getattr(self, "_reader", None)  # None: closed while starting, before it
        if reader is not None:
            # Each engine's last message (its final counts) is read before its socket is
            # closed here: the engines have ended, so the reader soon meets each socket's end.
            deadline = time.monotonic() + life.FINAL_COUNTS
            while not all(e.gone for e in engines) and time.monotonic() < deadline:
                time.sleep(0.001)
        for e in engines:
            with contextlib.suppress(OSError):
                os.close(e.release_fd)
            e.conn.close()
        if reader is not None:
            reader.stop()
        # What each engine counted to its end (sent as it stopped).
        final = []
        for e in self._engines:
            last = None
            while not e.replies.empty():
                last = e.replies.get_nowait()
            if last is not None:
                final.append(last)
        self._final = self._replaced.with_counts_of(final)
        if self._uploader is not None:
            with contextlib.suppress(Exception):
                self._uploader.close()  # unregisters the rings' pages before unmapping
        for e in engines:
            e.ring.close()  # freed once no batch of it is referenced
        self._remove_budget_folder()

    def _remove_budget_folder(self) -> None:
        if self._budget_folder is not None:
            shutil.rmtree(self._budget_folder, ignore_errors=True)


def _ref(ring: BatchRing) -> SegmentRef:
    assert ring.ref is not None
    return ring.ref


def _close_unlaunched(pipes: list[tuple[int, int]], rings: list[BatchRing]) -> None:
    """Close the pipes and rings made for engines that were never launched."""
    for fds in pipes:
        for fd in fds:
            os.close(fd)
    for ring in rings:
        ring.close()
