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
from dataclasses import dataclass, field

from .._base import _lifecycle as life
from .._base._child import how_it_ended, launch
from .._base._errors import PipelineDeadError
from .._base._stats import Counters
from .._base._wire import ChildFailed, Message
from .._device._ring import BatchRing
from ._control import Counts, EngineReady, Listed, Produced, ProductionFailed
from ._notices import Failed, Notice

__all__ = ["EVERY_GENERATION", "EngineLink"]

_ENTRY = "asyncloader._run._engine:engine_main"
EVERY_GENERATION = -1
"""The generation of a failure of the engine itself: whatever start it was made for."""


@dataclass
class EngineLink:
    """Engine process ``k``: its process, socket, slot pipe (``release_fd``, the trainer's
    end), and what it sent.

    Attributes:
        notices: ``(generation, notice)`` in the order the engine made them.
        replies: Its counters, as asked for.
        ready: Its ready message, once heard.
        failed: Why it cannot go on, once known.
        gone: Its socket ended.
        ring: Its ring, mapped here once it is ready.
        heard: Set once it is ready, failed or gone.
    """

    k: int
    proc: subprocess.Popen[bytes]
    conn: mpc.Connection
    release_fd: int
    notices: queue.Queue[tuple[int, Notice]] = field(default_factory=queue.Queue)
    replies: queue.Queue[Counters] = field(default_factory=queue.Queue)
    ready: EngineReady | None = None
    failed: BaseException | None = None
    gone: bool = False
    ring: BatchRing | None = None
    heard: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def launch(cls, k: int, order: bytes, r: int, w: int) -> EngineLink:
        """Start engine ``k`` on its pickled ``order`` with the read end ``r`` of its slot
        pipe (closed here once the child has it; ``w`` stays, or is closed if the start
        fails)."""
        try:
            proc, conn = launch(_ENTRY, "asyncloader-engine", order, pass_fds=(r,))
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        return cls(k, proc, conn, w)

    def dispatch(self, msg: Message) -> Listed | BaseException | None:
        """On the reader thread: ``msg`` to where it is waited for.  A :class:`Listed` (the
        loader's dataset) and a failure (the engine cannot go on) are the caller's."""
        if isinstance(msg, Produced):
            self.notices.put((msg.generation, msg.notice))
        elif isinstance(msg, ProductionFailed):
            self.notices.put((msg.generation, Failed(msg.error.rebuild())))
        elif isinstance(msg, Counts):
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

    def fail(self, error: BaseException) -> None:
        """It cannot go on: its start raises ``error``, and so does whoever waits for its
        next batch."""
        self.failed = error
        self.notices.put((EVERY_GENERATION, Failed(error)))
        self.heard.set()

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

    def died(self, when: str) -> PipelineDeadError:
        """The error that says it ended ``when``, and how."""
        code = self.proc.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(life.CHILD_EXIT)
        return PipelineDeadError(
            f"engine process {self.k} (pid {self.proc.pid}) {how_it_ended(code)} {when}; "
            "what it printed is on stderr. EngineConfig(mode='inline') runs the engine in "
            "this process."
        )
