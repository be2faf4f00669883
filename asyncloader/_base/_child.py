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
import errno
import itertools
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
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from ._errors import AsyncLoaderError
from ._wire import Message

__all__ = [
    "SHM_PREFIX",
    "SINGLE_THREADED",
    "Launch",
    "attach_shm",
    "how_it_ended",
    "launch",
    "new_shm",
    "receive_order",
    "reserve_shm",
    "shm_free_bytes",
    "stop_children",
    "unlink_shm",
    "unlink_shm_of",
    "unpickle_order",
]

SHM_PREFIX = "asyncloader_"
"""Every segment this package makes is ``asyncloader_<pid>_<n>``, ``pid`` its maker's: a
leak is easy to spot in /dev/shm, and what a killed process made can be found and removed
(:func:`unlink_shm_of`)."""
_shm_counter = itertools.count()


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


def attach_shm(name: str) -> SharedMemory:
    """Another process's segment, not registered with a resource tracker of this process.

    Its owner unlinks it.  Python < 3.13 registers every attach, and a tracker of this
    process's own would unlink the segment when this process exits.
    """
    return _untracked(name, 0)


def new_shm(size: int, what: str, *, tracked: bool) -> SharedMemory:
    """A new segment of ``size`` bytes named ``asyncloader_<pid>_<n>``, its pages reserved
    (:func:`reserve_shm`; ``what`` names it in the error).  ``tracked``: registered with
    this process's resource tracker, which unlinks it should this process be killed;
    untracked (an engine process, which needs no tracker process of its own and starts
    faster without one), its maker unlinks it with :func:`unlink_shm`, or, where the maker
    was killed, its parent with :func:`unlink_shm_of`.

    Raises:
        AsyncLoaderError: ``/dev/shm`` has no room for it.
    """
    name = f"{SHM_PREFIX}{os.getpid()}_{next(_shm_counter)}"
    size = max(size, 1)
    shm = SharedMemory(name=name, create=True, size=size) if tracked else _untracked(name, size)
    try:
        reserve_shm(shm, size, what)
    except BaseException:
        shm.close()
        if tracked:
            shm.unlink()
        else:
            unlink_shm(name)
        raise
    return shm


def reserve_shm(shm: SharedMemory, size: int, what: str) -> None:
    """Back every page of ``shm``'s first ``size`` bytes now (``posix_fallocate``).  A
    segment is sparse when made: its pages are taken from ``/dev/shm`` when first written,
    and where ``/dev/shm`` is full by then (Docker's default is 64 MB) the write kills the
    writer with SIGBUS, mid-epoch.  Reserved at once, a segment that does not fit fails
    here, before the first batch, with what to do.

    Raises:
        AsyncLoaderError: ``/dev/shm`` has no room for it (``what`` names it); its maker
            closes and unlinks it.
    """
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # macOS: pages come as they are written
        return
    try:
        fallocate(shm._fd, 0, size)  # type: ignore[attr-defined]
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            return  # a file system that cannot reserve: pages come as they are written
        free = shm_free_bytes()
        raise AsyncLoaderError(
            f"{what} needs {size / 1e6:.0f} MB of shared memory and /dev/shm has "
            f"{free / 1e6:.0f} MB free. Give it more: docker run --shm-size=2g (or "
            "--ipc=host); on Kubernetes, an emptyDir volume with medium: Memory mounted at "
            "/dev/shm. Or make the rings smaller: a smaller batch_size, or "
            "EngineConfig(prefetch_batches=) (ring slots)"
        ) from exc


def shm_free_bytes() -> int:
    """Bytes free in ``/dev/shm`` (0 where it cannot be read)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def unlink_shm(name: str) -> None:
    """Remove the segment ``name`` (made by :func:`create_shm`) from /dev/shm, if it is
    still there; mappings of it stay valid until they are closed.  No resource tracker is
    asked (``SharedMemory.unlink`` would start one to unregister it)."""
    import _posixshmem  # type: ignore[import-not-found]

    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name.lstrip("/"))


def unlink_shm_of(pid: int) -> list[str]:
    """Remove every segment process ``pid`` made (:func:`new_shm`) and left behind: it was
    killed before its teardown.  The names removed ([] where /dev/shm cannot be listed)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    mine = [n for n in names if n.startswith(f"{SHM_PREFIX}{pid}_")]
    for name in mine:
        unlink_shm(name)
    return mine


def _untracked(name: str, size: int) -> SharedMemory:
    create = size > 0
    if sys.version_info >= (3, 13):
        return SharedMemory(  # type: ignore[call-arg,unused-ignore]
            name=name, create=create, size=size, track=False
        )
    from multiprocessing import resource_tracker

    register = resource_tracker.register
    resource_tracker.register = lambda *args: None  # type: ignore[assignment]
    try:
        return SharedMemory(name=name, create=create, size=size)
    finally:
        resource_tracker.register = register
