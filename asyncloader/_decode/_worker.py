"""The child side of a decode process: a fresh ``python -c`` interpreter that attaches the
ring's shared memory and runs the jobs its socket brings, writing pixels into the ring.

It imports numpy, Pillow and this package, and the user's ``__main__`` only when the pickled
spec needs it (a ``decode=`` hook defined there).  Only a few numbers come in (the object's
bytes are read in place from the parent's shared-memory arena; through the socket only when
the arena had no room); only the outcome (or a picklable error) goes back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection as mpc
import os
from dataclasses import dataclass

import numpy as np

from .._base._child import receive_order, unpickle_order
from .._base._errors import DecodeError, PipelineDeadError
from .._base._shm import Segment, SegmentRef
from .._base._types import DecodeJob, Outcome
from .._base._wire import ChildFailed, CrossedError, Message, Stop, send
from ._arena import ArenaSlice
from ._image import DecodeSpec, U8Array
from ._job import run_job

__all__ = ["Jobs", "Results", "WorkerOrder", "WorkerReady", "worker_main"]

# A decode worker's messages (the shape every child protocol shares: _base/_wire.py):
#
#   engine (or inline loader)                 decode worker
#     │── WorkerOrder (launch) ──────────────────►│ attaches the ring and the arena
#     │◄──────── WorkerReady | ChildFailed ───────│
#     │── Jobs ──────────────────────────────────►│ decodes into the ring
#     │◄──────── Results (two jobs at most) ──────│
#     │── Stop ──────────────────────────────────►│ sends what it holds, exits


@dataclass(frozen=True, slots=True)
class WorkerOrder:
    """What a decode worker is told at its start: the pickled :class:`DecodeSpec` (it may
    refer to the user's ``__main__``), the ring's segment and image shape, and the arena's
    segment (None: bytes come through the socket)."""

    spec: bytes
    ring: SegmentRef
    shape: tuple[int, ...]
    arena: SegmentRef | None


@dataclass(frozen=True, slots=True)
class WorkerReady(Message):
    """Worker → parent: attached, ready for jobs."""


@dataclass(frozen=True, slots=True)
class Jobs(Message):
    """Parent → worker: jobs to run, each with the parent's id for it."""

    ids: tuple[int, ...]
    jobs: tuple[DecodeJob, ...]


@dataclass(frozen=True, slots=True)
class Results(Message):
    """Worker → parent: how each job went, by id (its failure crossed as a value)."""

    ids: tuple[int, ...]
    outcomes: tuple[Outcome | CrossedError, ...]


def worker_main(fd: int) -> None:
    """Entry point of a decode process, started by :func:`~asyncloader._base._child.launch`
    with its socket as ``fd``.

    The order carries the pickled :class:`DecodeSpec`, and the ring's and the arena's names
    and shapes.  The parent's ``__main__`` is imported only when the spec needs it (a
    ``decode_fn`` defined there): a plain worker starts with numpy and Pillow alone.
    """
    got = receive_order(fd)
    if got is None:
        return
    conn, main, order = got
    where = f"decode worker {os.getpid()}"
    try:
        spec = unpickle_order(order.spec, main)
    except BaseException as exc:
        error = PipelineDeadError(f"{where} could not start: {exc!r}")
        error.__cause__ = exc
        with contextlib.suppress(Exception):
            send(conn, ChildFailed(CrossedError.of(error, where)), where)
        return
    _serve(conn, spec, order.ring, order.shape, order.arena, where)


REPLY_BATCH = 2
"""Replies a worker sends in one message at most (the parent keeps ``depth`` jobs queued
in each worker, more than this)."""


def _serve(
    conn: mpc.Connection,
    spec: DecodeSpec,
    ring: SegmentRef,
    shape: tuple[int, ...],
    arena_ref: SegmentRef | None,
    where: str,
) -> None:
    try:
        shm = Segment.attach(ring)
        arena = Segment.attach(arena_ref) if arena_ref else None
    except Exception as exc:  # the parent closed the loader meanwhile, or /dev/shm failed
        with contextlib.suppress(Exception):
            send(conn, ChildFailed(CrossedError.of(exc, where)), where)
        return
    images: U8Array = np.ndarray(shape, np.uint8, buffer=shm.buf)
    view = arena.buf if arena is not None else None
    ids: list[int] = []
    outcomes: list[Outcome | CrossedError] = []

    def reply() -> None:
        send(conn, Results(tuple(ids), tuple(outcomes)), where)
        ids.clear()
        outcomes.clear()

    try:
        send(conn, WorkerReady(), where)
        while True:
            msg = conn.recv()
            if isinstance(msg, Stop):
                if ids:
                    reply()
                return
            assert isinstance(msg, Jobs)
            job: DecodeJob
            for n, (job_id, job) in enumerate(zip(msg.ids, msg.jobs, strict=True), 1):
                if isinstance(job.data, ArenaSlice):
                    assert view is not None
                    at = job.data
                    job = dataclasses.replace(job, data=view[at.offset : at.offset + at.size])
                ids.append(job_id)
                try:
                    outcomes.append(run_job(job, images[job.slot, job.index], spec))
                except Exception as exc:
                    err = exc
                    if not isinstance(exc, DecodeError):
                        err = DecodeError(repr(exc), key=job.key)
                        err.__cause__ = exc
                    outcomes.append(CrossedError.of(err, where))
                    del err, exc
                # Replies go back in twos (each message wakes the parent: a write and a
                # context switch, 5 % of a worker's time when sent one by one), and at once
                # when this worker would otherwise wait: the parent sends more jobs as
                # replies come back, so the worker always holds the next job meanwhile.
                if len(ids) >= REPLY_BATCH or (n == len(msg.ids) and not conn.poll()):
                    reply()
            del job
    except (EOFError, OSError):
        return  # the parent is gone
    finally:
        if spec.cache is not None:
            with contextlib.suppress(Exception):
                spec.cache.close()  # the index connection, before the interpreter ends
        del images, view
        with contextlib.suppress(Exception):
            shm.close()
        if arena is not None:
            with contextlib.suppress(Exception):
                arena.close()
