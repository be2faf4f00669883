"""Engine processes, the training process's side (``EngineConfig(mode="process")``).

The loader's engine runs in ``n`` processes (:mod:`._engine`): engine ``k`` fetches, caches
and decodes batches ``k, k + n, …`` of the rank's share into a ring of its own in shared
memory.  Here, in the training process, only this runs:

* a reader thread that takes the engines' messages off their sockets (one per batch);
* :meth:`EngineProcesses.next_notice`, which hands the batches out in order: batch ``b``
  comes from engine ``b % n``;
* leases on the mapped rings: when a batch's last reference goes, its slot goes back to its
  engine as four bytes on a pipe (from whichever thread dropped it);
* counters gathered from the engines when ``stats()`` asks.

Nothing here runs per sample.  Engines stop when asked (``close()``), and by themselves
when the training process is gone (their socket ends), unlinking their rings.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import os
import pickle
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._base import _lifecycle as life
from .._base._child import stop_children, unlink_shm
from .._base._errors import ClosedError, PipelineDeadError
from .._base._stats import Counters
from .._base._wire import Message, Stop
from .._dataset._labels import Dataset
from .._device._ring import BatchRing
from ._build import split_plan
from ._control import (
    SLOT,
    AskCounters,
    EngineOrder,
    EngineShare,
    EngineSpec,
    Listed,
    StartEpoch,
    TakeDataset,
)
from ._link import EVERY_GENERATION, EngineLink
from ._notices import BatchReady, EpochEnd, Failed, Notice
from ._sampler import batch_owner, samples_per_epoch

if TYPE_CHECKING:
    from .._device._upload import Uploader

__all__ = ["EngineProcesses", "OrderNotPicklable"]


class OrderNotPicklable(Exception):
    """An option of the loader (a hook, a labels function) cannot go to another process."""


class EngineProcesses:
    """The loader's engine in ``n`` processes (see the module's docstring).

    Args:
        spec: What the engines read and how (its plan split among them; streaming while
            the store lists with one engine only).
        n: Engine processes.

    Raises:
        OrderNotPicklable: an option cannot be sent to an engine process.
        AsyncLoaderError, ValueError: the engine could not start (its error, as the inline
            engine would raise it: a listing that failed, an empty dataset).
    """

    def __init__(self, spec: EngineSpec, n: int) -> None:
        p = spec.plan
        self.plan = p
        self.workers = p.workers
        self._n = n
        self._run = p.run
        self._closed = False
        self._lock = threading.Lock()  # sends on the engines' sockets
        self._generation = 0
        self._expect = self._first_of(0)  # the next batch of the current generation
        # Once an engine ended an epoch: (epoch, engines that still owe their end).
        self._owed: tuple[int, set[int]] | None = None
        self._dataset: Dataset | None = None
        self._listed = threading.Event()
        self._listing_error: BaseException | None = None
        self._final = Counters()  # the engines' counts when they stopped
        self._uploader: Uploader | None = None
        self._budget_folder = None
        if n > 1 and spec.folder is None:
            # The engines of one loader share one fetch budget, as the loaders of a node do
            # through their cache folder.
            self._budget_folder = tempfile.mkdtemp(prefix="asyncloader-budget-")
        plans = split_plan(p, n)
        known = spec.objects is not None
        # The slot pipes first: each order names its pipe's end as the engine sees it (the
        # same number), so every order is pickled once, and a failure to pickle is known
        # before any process starts.
        pipes = [os.pipe() for _ in range(n)]
        orders = []
        for k in range(n):
            order = EngineOrder(
                spec=replace(spec, plan=plans[k], stream=spec.stream and n == 1),
                share=EngineShare(part=(k, n), budget_folder=self._budget_folder, shared_ring=True),
                await_dataset=k > 0 and not known,
                release_fd=pipes[k][0],
            )
            try:
                orders.append(pickle.dumps(order))
            except (pickle.PicklingError, AttributeError, TypeError) as exc:
                for fds in pipes:
                    for fd in fds:
                        os.close(fd)
                self._remove_budget_folder()
                raise OrderNotPicklable(str(exc)) from exc
            del order
        self._engines: list[EngineLink] = []
        try:
            while pipes:
                k = n - len(pipes)
                r, w = pipes.pop(0)
                self._engines.append(EngineLink.launch(k, orders[k], r, w))
            self._reader = threading.Thread(
                target=self._read, name="asyncloader-engines", daemon=True
            )
            self._reader.start()
            lead = self._engines[0].wait_ready()
            if not known and n > 1:
                assert lead.dataset is not None
                for e in self._engines[1:]:
                    self._send(e, TakeDataset(lead.dataset))
            for e in self._engines[1:]:
                e.wait_ready()
            for e in self._engines:
                assert e.ready is not None
                plan = plans[e.k]
                e.ring = BatchRing.attached(
                    e.ready.ring, e.ready.slots, plan.run.batch_size, plan.spec.sample_shape
                )
                fd = e.release_fd
                e.ring.on_release = lambda slot, fd=fd: _give_back(fd, slot)
            if lead.dataset is not None:
                self._dataset = lead.dataset
                self._listed.set()
        except BaseException:
            for fds in pipes:  # not launched
                for fd in fds:
                    os.close(fd)
            self.close()
            raise

    # --- messages -----------------------------------------------------------------------

    def _read(self) -> None:
        """The reader thread: every engine message to where it is waited for."""
        live = {e.conn: e for e in self._engines}
        while live:
            ready: list[mpc.Connection]
            try:
                ready = mpc.wait(list(live), timeout=1.0)  # type: ignore[assignment]
            except OSError:  # a socket closed by close()
                ready = [conn for conn in live if conn.closed]
            for conn in ready:
                e = live[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    e.gone = True
                    e.heard.set()
                    live.pop(conn)
                    continue
                except Exception as exc:  # a message that cannot be unpickled here
                    error = PipelineDeadError(
                        f"a message from engine process {e.k} could not be read: {exc!r}"
                    )
                    error.__cause__ = exc
                    self._fail(e, error)
                    continue
                out = e.dispatch(msg)
                if isinstance(out, Listed):
                    self._listing_error = out.error.rebuild() if out.error else None
                    self._dataset = out.dataset
                    self._listed.set()
                elif out is not None:
                    self._fail(e, out)

    def _fail(self, e: EngineLink, error: BaseException) -> None:
        """Engine ``e`` cannot go on (see :meth:`EngineLink.fail`); the lead's failure is
        the listing's too."""
        e.fail(error)
        if e.k == 0 and not self._listed.is_set():
            self._listing_error = error
            self._listed.set()

    def _send(self, e: EngineLink, msg: Message) -> None:
        with self._lock:
            e.send(msg)

    # --- the surface the loader uses (see _control.Engine) ------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def processes(self) -> int:
        return self._n

    @property
    def pids(self) -> list[int]:
        return [e.proc.pid for e in self._engines]

    def start(self, epoch: int, first: int, span: tuple[int, int] | None) -> None:
        if self._closed:
            raise ClosedError("the loader is closed")
        self._generation += 1
        self._expect = self._first_of(first)
        self._owed = None
        for e in self._engines:
            self._send(e, StartEpoch(self._generation, epoch, first, span))

    def _first_of(self, first: int) -> int:
        """The first batch from ``first`` on that is this DataLoader worker's."""
        r = self._run
        return first + (r.worker - first) % r.num_workers

    def _owner(self, index: int) -> EngineLink:
        return self._engines[batch_owner(index, self._run.num_workers, self._n)[1]]

    def next_notice(self, timeout: float) -> Notice:
        deadline = time.monotonic() + timeout
        while True:
            if self._owed is not None:
                # Batch `_expect` does not exist: every engine ends this epoch.  Take their
                # ends (their next epoch's notices stay queued behind).
                epoch, owed = self._owed
                for k in sorted(owed):
                    notice = self._take(self._engines[k], deadline)
                    if isinstance(notice, Failed):
                        return notice
                    if not isinstance(notice, EpochEnd):
                        raise PipelineDeadError(
                            f"engine process {k} sent {notice!r} after the end of epoch {epoch}"
                        )
                    owed.discard(k)
                self._owed = None
                self._expect = self._first_of(0)
                return EpochEnd(epoch)
            e = self._owner(self._expect)
            notice = self._take(e, deadline)
            if isinstance(notice, BatchReady):
                if notice.index != self._expect:
                    raise PipelineDeadError(
                        f"engine process {e.k} sent batch {notice.index}, not {self._expect}"
                    )
                self._expect += self._run.num_workers
                return replace(notice, ring=e.k)
            if isinstance(notice, EpochEnd):
                self._owed = (notice.epoch, {x.k for x in self._engines if x is not e})
                continue
            return notice  # Failed

    def _take(self, e: EngineLink, deadline: float) -> Notice:
        """The engine's next notice of the current generation (older ones are dropped,
        their slots given back).

        Raises:
            queue.Empty: none before ``deadline``.
            PipelineDeadError: an engine process died.
        """
        while True:
            for other in self._engines:
                if other.gone and other.notices.empty():
                    self._dead(other)
            try:
                generation, notice = e.notices.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                if e.gone:
                    self._dead(e)
                raise
            if generation in (self._generation, EVERY_GENERATION):
                return notice
            if isinstance(notice, BatchReady):
                _give_back(e.release_fd, notice.slot)  # made before the last start

    def _dead(self, e: EngineLink) -> None:
        if self._closed:
            raise ClosedError("the loader is closed")
        raise e.died("while running")

    def lease(self, ready: BatchReady) -> tuple[Any, np.ndarray[Any, Any]]:
        ring = self._engines[ready.ring].ring
        assert ring is not None
        return ring.lease(ready.slot, ready.n)

    def held_ring(self) -> BatchRing | None:
        return self._owner(self._expect).ring

    def dataset(self) -> Dataset:
        while not self._listed.wait(0.1):
            if self._closed:
                raise ClosedError("the loader is closed")
            lead = self._engines[0]
            if lead.gone:
                self._dead(lead)
        if self._listing_error is not None:
            raise self._listing_error
        assert self._dataset is not None
        return self._dataset

    def epoch_samples(self) -> int:
        return samples_per_epoch(len(self.dataset().samples), self._run)

    def engine_counters(self) -> Counters:
        """The engines' counters, summed (an engine that does not answer within
        ``COUNTERS_REPLY`` is left out)."""
        if self._closed:
            return self._final
        for e in self._engines:
            while not e.replies.empty():  # late answers to an earlier question
                e.replies.get_nowait()
            self._send(e, AskCounters())
        parts = []
        deadline = time.monotonic() + life.COUNTERS_REPLY
        for e in self._engines:
            with contextlib.suppress(queue.Empty):
                parts.append(e.replies.get(timeout=max(deadline - time.monotonic(), 0)))
        return Counters.merged(parts)

    def ring_held(self) -> int:
        return sum(e.ring.held for e in self._engines if e.ring is not None)

    def set_uploader(self, uploader: Uploader) -> None:
        for e in self._engines:
            assert e.ring is not None
            uploader.prepare(e.ring.images)
        self._uploader = uploader

    def close(self) -> None:
        """Ask every engine to stop, wait for them (then terminate, then kill), close the
        uploader and the rings' mappings (each freed once no batch references it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        engines = getattr(self, "_engines", [])
        for e in engines:
            if not e.gone:
                with contextlib.suppress(OSError, ValueError):
                    e.conn.send(Stop())
        stop_children([e.proc for e in engines], life.ENGINE_GRACE, life.KILL_STEP)
        for e in engines:
            with contextlib.suppress(OSError):
                os.close(e.release_fd)
            e.conn.close()
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.join(life.READER_JOIN)
        # What each engine counted to its end (sent as it stopped).
        final = []
        for e in engines:
            last = None
            while not e.replies.empty():
                last = e.replies.get_nowait()
            if last is not None:
                final.append(last)
        self._final = Counters.merged(final)
        if self._uploader is not None:
            with contextlib.suppress(Exception):
                self._uploader.close()  # unregisters the rings' pages before unmapping
        for e in engines:
            if e.ring is not None:
                e.ring.close()
            if e.ready is not None:
                unlink_shm(e.ready.ring)  # gone with its engine, unless that engine was killed
        self._remove_budget_folder()

    def _remove_budget_folder(self) -> None:
        if self._budget_folder is not None:
            shutil.rmtree(self._budget_folder, ignore_errors=True)


def _give_back(fd: int, slot: int) -> None:
    """Slot ``slot`` goes back to its engine (from any thread; never raises)."""
    with contextlib.suppress(OSError):
        os.write(fd, SLOT.pack(slot))
