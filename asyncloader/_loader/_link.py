"""One engine process as the training process sees it: the process, its socket and slot
pipe, its mapped ring, what it sent (sorted by the reader thread into where each message is
waited for), and how it ended, named truly."""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field

from .._base import _lifecycle as life
from .._base._errors import PipelineDeadError
from .._base._proctree import process_rss_bytes
from .._base._stats import Counters
from .._device._ring import BatchRing
from .._run._notices import BatchReady, EpochEnd, Failed, Notice
from ._launch import how_it_ended, launch
from ._wire import (
    SLOT,
    ChildFailed,
    Counts,
    EngineReady,
    Listed,
    Message,
    Produced,
    ProductionFailed,
)

__all__ = ["EVERY_GENERATION", "EngineLink"]

_ENTRY = "asyncloader._loader._child:engine_main"
EVERY_GENERATION = -1
"""The generation of a failure of the engine itself: whatever start it was made for."""


@dataclass
class EngineLink:
    """Engine process ``k``: its process, socket, slot pipe (``release_fd``, the trainer's
    end), and what it sent.

    Attributes:
        serial: Which engine process of its loader, replacements counted (its ring's key).
        notices: ``(generation, notice)`` in the order the engine made them.
        replies: Its counters, as asked for.
        last_counts: The last counters it sent.
        ready: Its ready message, once heard.
        failed: Why it cannot go on, once known.
        gone: Its socket ended.
        ring: The ring it fills, made here.
        heard: Set once it is ready, failed or gone.
        position: ``(epoch, batch)``: where its stream goes on after the last notice the
            trainer took of it (a replacement starts there).
        memory: Its resident memory when last looked at [bytes].
    """

    k: int
    serial: int
    proc: subprocess.Popen[bytes]
    conn: mpc.Connection
    release_fd: int
    ring: BatchRing
    notices: queue.Queue[tuple[int, Notice]] = field(default_factory=queue.Queue)
    replies: queue.Queue[Counters] = field(default_factory=queue.Queue)
    last_counts: Counters | None = None
    ready: EngineReady | None = None
    failed: BaseException | None = None
    gone: bool = False
    heard: threading.Event = field(default_factory=threading.Event)
    position: tuple[int, int] = (0, 0)
    memory: int = 0

    @classmethod
    def launch(
        cls, k: int, serial: int, order: bytes, r: int, w: int, ring: BatchRing
    ) -> EngineLink:
        """Start engine ``k`` on its pickled ``order`` with the read end ``r`` of its slot
        pipe (closed here once the child has it; ``w`` stays, or is closed if the start
        fails) and ``ring`` (made here; its slots go back on ``w``)."""
        assert ring.ref is not None
        try:
            proc, conn = launch(_ENTRY, "asyncloader-engine", order, pass_fds=(r, *ring.ref.fds))
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        ring.on_release = lambda slot: _give_back(w, slot)
        return cls(k, serial, proc, conn, w, ring)

    def dispatch(self, msg: Message) -> Listed | BaseException | None:
        """On the reader thread: ``msg`` to where it is waited for.  A :class:`Listed` (the
        loader's dataset) and a failure (the engine cannot go on) are the caller's."""
        if isinstance(msg, Produced):
            self.notices.put((msg.generation, msg.notice))
        elif isinstance(msg, ProductionFailed):
            self.notices.put((msg.generation, Failed(msg.error.rebuild())))
        elif isinstance(msg, Counts):
            self.last_counts = msg.counters
            self.replies.put(msg.counters)
        elif isinstance(msg, EngineReady):
            self.ready = msg
            self.heard.set()
        elif isinstance(msg, Listed):
            return msg
        elif isinstance(msg, ChildFailed):
            return msg.error.rebuild()
        else:
            return PipelineDeadError(f"engine process {self.k} sent {msg!r}")
        return None

    def counters_by(self, deadline: float) -> Counters | None:
        """Its answer to the trainer's last :class:`AskCounters`, waited for until
        ``deadline`` (``time.monotonic()``) or until its socket ends: then the counts it
        last sent, as a dead engine's (:meth:`Counters.of_the_dead`, what its replacement
        will keep of it), so that the question does not wait on a process that cannot
        answer; None where it sent none, or does not answer in time."""
        while True:
            gone = self.gone  # read before the queue: its answers come before its end
            try:
                return self.replies.get(timeout=min(max(deadline - time.monotonic(), 0), 0.05))
            except queue.Empty:
                if gone:
                    last = self.last_counts
                    return last.of_the_dead() if last is not None else None
                if time.monotonic() >= deadline:
                    return None

    def fail(self, error: BaseException) -> None:
        """It cannot go on: its start raises ``error``, and so does whoever waits for its
        next batch."""
        self.failed = error
        self.notices.put((EVERY_GENERATION, Failed(error)))
        self.heard.set()

    def took(self, notice: Notice) -> None:
        """The trainer took ``notice`` of it: its stream goes on after it."""
        if isinstance(notice, BatchReady):
            self.position = (notice.epoch, notice.index + 1)
        elif isinstance(notice, EpochEnd):
            self.position = (notice.epoch + 1, 0)

    def give_back(self, slot: int) -> None:
        """Slot ``slot`` of its ring goes back to it (a batch it made that is dropped)."""
        _give_back(self.release_fd, slot)

    def look_at_memory(self) -> None:
        """Note its resident memory now (the reader thread's, about once a second): the
        last figure is what its death names."""
        rss = process_rss_bytes(self.proc.pid)
        if rss:
            self.memory = rss

    def send(self, msg: Message) -> None:
        """Send ``msg`` unless it is gone (callers hold the trainer's send lock)."""
        if not self.gone:
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(msg)

    def wait_ready(self) -> EngineReady:
        """Its ready message.

        Raises:
            PipelineDeadError: it did not start in time, or ended first.
            BaseException: what it failed with (its own error, crossed).
        """
        if not self.heard.wait(life.ENGINE_START):
            raise PipelineDeadError(
                f"engine process {self.k} did not start in {life.ENGINE_START} s"
            )
        if self.failed is not None:
            raise self.failed
        if self.ready is None:
            raise self.died("while starting")
        return self.ready

    def retire(self, *, keep_ring: bool) -> str:
        """It died: its ring is freed once no batch of it is referenced here (``keep_ring``:
        not before the trainer closes, an uploader page-locked it).  How it ended, in words
        (:meth:`ending`)."""
        if not keep_ring:
            self.ring.close()
        return self.ending()

    def ending(self) -> str:
        """How it ended, in words, with its last known memory (waits briefly for its exit)."""
        code = self.proc.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(life.CHILD_EXIT)
        memory = f" (using {self.memory / 1e6:,.0f} MB when last seen)" if self.memory else ""
        return f"engine process {self.k} (pid {self.proc.pid}) {how_it_ended(code)}{memory}"

    def died(self, when: str, more: str = "") -> PipelineDeadError:
        """The error that says it ended ``when``, and how; ``more``: a sentence after."""
        return PipelineDeadError(
            f"{self.ending()} {when}; {more}what it printed is on stderr. "
            "EngineConfig(mode='inline') runs the engine in this process."
        )


def _give_back(fd: int, slot: int) -> None:
    """Slot ``slot`` goes back to its engine (from any thread; never raises)."""
    with contextlib.suppress(OSError):
        os.write(fd, SLOT.pack(slot))
