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
import traceback
from typing import Any

import numpy as np

from .._base._child import attach_shm, receive_order, unpickle_order
from .._base._errors import DecodeError
from .._base._types import DecodeJob
from ._arena import ArenaSlice
from ._image import DecodeSpec, U8Array
from ._job import run_job

__all__ = ["READY", "worker_main"]

READY = "ready"
"""The first message a worker sends: attached and ready for jobs."""


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
    conn, main, (spec_bytes, shm_name, shape, arena_name) = got
    spec = unpickle_order(spec_bytes, main)
    _serve(conn, spec, shm_name, shape, arena_name)


def _without_frames(exc: BaseException) -> BaseException:
    """``exc`` and the errors chained to it, without their tracebacks (their text is in a
    note already).  A traceback holds the frames the error went through, and with them
    views of the ring and of the arena: segments that then cannot close at exit."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


REPLY_BATCH = 2
"""Replies a worker sends in one message at most (the parent keeps ``depth`` jobs queued
in each worker, more than this)."""


def _serve(
    conn: mpc.Connection,
    spec: DecodeSpec,
    shm_name: str,
    shape: tuple[int, ...],
    arena_name: str | None,
) -> None:
    shm = attach_shm(shm_name)
    images: U8Array = np.ndarray(shape, np.uint8, buffer=shm.buf)
    arena = attach_shm(arena_name) if arena_name else None
    view = arena.buf if arena is not None else None
    try:
        conn.send(READY)
        replies: list[tuple[Any, ...]] = []
        while True:
            msg = conn.recv()
            if msg is None:
                if replies:
                    conn.send(replies)
                return
            job: DecodeJob
            for n, (job_id, job) in enumerate(msg, 1):  # a chunk of (job id, job)
                if isinstance(job.data, ArenaSlice):
                    assert view is not None
                    at = job.data
                    job = dataclasses.replace(job, data=view[at.offset : at.offset + at.size])
                try:
                    outcome = run_job(job, images[job.slot, job.index], spec)
                    replies.append((job_id, outcome, None))
                except Exception as exc:
                    err = (
                        exc if isinstance(exc, DecodeError) else DecodeError(repr(exc), key=job.key)
                    )
                    err.add_note("in a decode worker:\n" + traceback.format_exc())
                    replies.append((job_id, None, _without_frames(err)))
                    del err
                # Replies go back in twos (each message wakes the parent: a write and a
                # context switch, 5 % of a worker's time when sent one by one), and at once
                # when this worker would otherwise wait: the parent sends more jobs as
                # replies come back, so the worker always holds the next job meanwhile.
                if len(replies) >= REPLY_BATCH or (n == len(msg) and not conn.poll()):
                    conn.send(replies)
                    replies = []
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
