"""The training process's reader thread: every engine process's messages off its socket to
where they are waited for (:meth:`EngineLink.dispatch <._link.EngineLink.dispatch>`), and
each engine's memory noted about once a second.  Engines join it as they are launched,
replacements too; it ends once it is stopped and every socket it reads is closed."""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .._base import _lifecycle as life
from .._base._errors import PipelineDeadError
from ._link import EngineLink
from ._wire import Listed

__all__ = ["Reader"]


class Reader:
    """The reader thread (started at once).

    Args:
        listed: Told the lead's :class:`Listed` (a listing that grew is complete, or failed).
        failed: Told that an engine cannot go on, and why.
    """

    def __init__(
        self,
        listed: Callable[[Listed], None],
        failed: Callable[[EngineLink, BaseException], None],
    ) -> None:
        self._listed = listed
        self._failed = failed
        self._stopping = False
        # New engines come through this queue, and a byte on the pipe wakes the thread.
        self._joining: queue.SimpleQueue[EngineLink] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        # Daemon: close() stops it once every socket is closed; a loader never closed leaves
        # it waiting on sockets, and it must not keep the interpreter from exiting (the
        # engines end with the trainer's sockets).
        self._thread = threading.Thread(target=self._run, name="asyncloader-engines", daemon=True)
        self._thread.start()

    def add(self, e: EngineLink) -> None:
        """Read ``e``'s messages from now on."""
        self._joining.put(e)
        self._wake()

    def stop(self) -> None:
        """End the thread (call once every engine's socket is closed), waiting up to
        ``READER_JOIN``."""
        self._stopping = True
        self._wake()
        self._thread.join(life.READER_JOIN)
        if not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def _run(self) -> None:
        live: dict[mpc.Connection, EngineLink] = {}
        looked = 0.0
        while True:
            while not self._joining.empty():
                e = self._joining.get()
                live[e.conn] = e
            if self._stopping and all(conn.closed for conn in live):
                return
            ready: list[Any]
            try:
                ready = list(mpc.wait([*live, self._wake_r], timeout=1.0))  # type: ignore[arg-type]
            except OSError:  # a socket closed by the trainer's close()
                ready = [conn for conn in live if conn.closed]
            now = time.monotonic()
            if now - looked >= life.MEMORY_LOOK:
                looked = now
                for e in live.values():
                    e.look_at_memory()
            for conn in ready:
                if isinstance(conn, int):  # woken: an engine joined, or the end
                    with contextlib.suppress(OSError):
                        os.read(conn, 512)
                    continue
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
                    self._failed(e, error)
                    continue
                out = e.dispatch(msg)
                if isinstance(out, Listed):
                    self._listed(out)
                elif out is not None:
                    self._failed(e, out)
