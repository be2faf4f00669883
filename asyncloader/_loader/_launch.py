"""Child processes of our own: fresh ``python -c`` interpreters on a socket pair (a leaf).

Decode workers and engine processes both start this way: as safe with threads around as
``spawn`` (nothing is forked), with the parent's ``sys.path`` set on the command line before
anything is imported (so the child imports this very package, wherever the parent found
it), in a session of their own (Ctrl-C reaches the parent only; the parent decides when
children stop).  The first message on the socket carries multiprocessing's preparation data
(working directory, argv) and the child's order; the parent's ``__main__`` (the user's
training script, which usually imports torch and more) is imported only when the order
needs it, e.g. a ``decode=`` hook defined there.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import multiprocessing.process as mp_process
import multiprocessing.spawn as mp_spawn
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._wire import Message

__all__ = [
    "SINGLE_THREADED",
    "Launch",
    "how_it_ended",
    "launch",
    "receive_order",
    "stop_children",
    "unpickle_order",
]


SINGLE_THREADED = {
    name: "1"
    for name in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    )
}
"""A child's numeric libraries run one thread each: a child is one of the loader's workers,
sized to the node's CPU budget, and a pool of threads per library in each (OpenMP's default
is one per core) would oversubscribe the cores the budget shares out."""


def how_it_ended(code: int | None) -> str:
    """An engine process's end in words: its exit code, or the signal that killed it by name
    with what usually sends it."""
    if code is None:
        return "has not exited"
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    why = {
        "SIGKILL": ", often by the out-of-memory killer",
        "SIGBUS": ": a write into shared memory failed (/dev/shm full?)",
        "SIGSEGV": ": a crash in native code",
        "SIGTERM": ": asked to stop from outside",
    }.get(name, "")
    return f"was killed by {name}{why}"


@dataclass(frozen=True, slots=True)
class Launch(Message):
    """Parent → child, the first message: multiprocessing's preparation data (working
    directory, argv; ``sys.path`` travels on the command line), how to import the parent's
    ``__main__`` where the order needs it (:func:`unpickle_order`), and the order."""

    prep: dict[str, Any]
    main: dict[str, Any]
    order: Any


def launch(
    entry: str, name: str, order: Any, *, pass_fds: Sequence[int] = ()
) -> tuple[subprocess.Popen[bytes], mpc.Connection]:
    """Start ``entry`` (``"module:function"``, called with the child's socket fd) in a fresh
    interpreter, and send it ``order`` (read with :func:`receive_order`).  ``pass_fds``:
    more descriptors the child inherits (at the same numbers)."""
    prep = mp_spawn.get_preparation_data(name)
    parent_sock, child_sock = socket.socketpair()
    path = [p for p in sys.path if isinstance(p, str)]
    module, function = entry.split(":")
    fd = child_sock.fileno()
    code = f"import sys; sys.path[:] = {path!r}; from {module} import {function}; {function}({fd})"
    try:
        proc = subprocess.Popen(
            [mp_spawn.get_executable(), "-c", code],
            pass_fds=(fd, *pass_fds),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the parent decides when children stop, Ctrl-C or not
            env={**os.environ, **SINGLE_THREADED},
        )
    finally:
        child_sock.close()
    conn = mpc.Connection(parent_sock.detach())
    main: dict[str, Any] = {
        k: prep[k] for k in ("init_main_from_name", "init_main_from_path") if k in prep
    }
    bare: dict[str, Any] = {k: prep[k] for k in ("sys_argv", "dir", "orig_dir") if k in prep}
    with contextlib.suppress(OSError):  # died at once: the caller sees EOF
        conn.send(Launch(bare, main, order))
    return proc, conn


def stop_children(procs: Sequence[subprocess.Popen[bytes]], grace: float, step: float) -> None:
    """Wait up to ``grace`` seconds for children that were asked to stop, then terminate the
    ones still running, then kill them, waiting up to ``step`` seconds after each (one
    deadline for all of them: the wait does not grow with their number).  Blocking."""
    for signal_them, wait in ((None, grace), ("terminate", step), ("kill", step)):
        running = [p for p in procs if p.poll() is None]
        if not running:
            return
        for p in running:
            if signal_them is not None:
                with contextlib.suppress(OSError):
                    getattr(p, signal_them)()
        deadline = time.monotonic() + wait
        for p in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(deadline - time.monotonic(), 0))


def receive_order(fd: int) -> tuple[mpc.Connection, dict[str, Any], Any] | None:
    """The child's side of :func:`launch`: its connection, the parent's ``__main__``
    preparation data (for :func:`unpickle_order`) and its order; None when the parent went
    away first.  Ctrl-C is ignored from here on: it reaches the whole process group, and the
    parent decides when children stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = mpc.Connection(fd)
    try:
        first: Launch = conn.recv()
    except (EOFError, OSError):
        return None
    mp_spawn.prepare(first.prep)
    return conn, first.main, first.order


def unpickle_order(data: bytes, main: dict[str, Any]) -> Any:
    """``data`` unpickled; when it refers to the user's script (a hook defined there), the
    script is imported first, as ``spawn`` does, and like spawn it may not start processes
    meanwhile (an unguarded script that makes a loader fails with multiprocessing's clear
    error instead of starting children again)."""
    try:
        return pickle.loads(data)
    except (AttributeError, ImportError):
        if not main:
            raise
    mp_process.current_process()._inheriting = True  # type: ignore[attr-defined]
    try:
        mp_spawn.prepare(main)
    finally:
        del mp_process.current_process()._inheriting  # type: ignore[attr-defined]
    return pickle.loads(data)
