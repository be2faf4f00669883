"""Ending a thread of our own waits until the operating system has ended it: a ``fork()``
right after must not copy a lock its C library exit handlers hold (OpenSSL's)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import threading

import pytest

from asyncloader._base._own_thread import run_here, run_on_own_thread, wait_exited
from asyncloader._run._runtime import Runtime

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc/self/task and pthread keys"
)

_EXIT_MS = 300


def _slow_exit() -> None:
    """Give this thread a C thread-exit handler that runs ``_EXIT_MS`` after its Python part
    ended (as OpenSSL's per-thread cleanup does, only longer): a pthread key whose destructor
    is libc's ``usleep``, called with the key's value."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    key = ctypes.c_uint()
    usleep = ctypes.cast(libc.usleep, ctypes.c_void_p)
    assert libc.pthread_key_create(ctypes.byref(key), usleep) == 0
    assert libc.pthread_setspecific(key, ctypes.c_void_p(_EXIT_MS * 1000)) == 0


def test_wait_exited_returns_once_the_thread_is_gone_for_the_os() -> None:
    thread = threading.Thread(target=_slow_exit)
    thread.start()
    thread.join()
    task = f"/proc/self/task/{thread.native_id}"
    if sys.version_info >= (3, 13):  # join() waits for the OS thread itself from 3.13 on
        assert not os.path.exists(task)
        return
    assert os.path.exists(task)  # joined, yet still running its exit handlers
    wait_exited(thread)
    assert not os.path.exists(task)


def test_run_on_own_thread_returns_after_its_thread_is_gone() -> None:
    seen: list[int] = []

    async def work() -> int:
        seen.append(threading.get_native_id())
        _slow_exit()
        return 7

    assert run_on_own_thread(work()) == 7
    assert not os.path.exists(f"/proc/self/task/{seen[0]}")

    async def fail() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        run_on_own_thread(fail())


def _slow_exit_here() -> int:
    _slow_exit()
    return threading.get_native_id()


@pytest.mark.parametrize("run", [run_here, run_on_own_thread])
def test_a_loop_s_blocking_calls_threads_are_gone_when_it_returns(run: object) -> None:
    """``asyncio.to_thread``'s threads (botocore's credentials run there, making TLS
    contexts) are ended for the OS too when the loop's runner returns: ``asyncio.run``
    joins them, which leaves their C exit handlers running."""

    async def work() -> int:
        return await asyncio.to_thread(_slow_exit_here)

    tid = run(work())  # type: ignore[operator]
    assert tid != threading.get_native_id()
    assert not os.path.exists(f"/proc/self/task/{tid}")


def test_a_runtime_s_blocking_calls_threads_are_gone_when_it_closes() -> None:
    """A loader's loop (``Runtime``): ``loop.close()`` does not wait for its executor's
    threads at all; ``close()`` waits them out, for the OS too."""
    runtime = Runtime()

    async def work() -> int:
        return await asyncio.to_thread(_slow_exit_here)

    tid = runtime.call(work())
    runtime.close()
    assert not os.path.exists(f"/proc/self/task/{tid}")


def test_run_here_where_a_loop_already_runs_runs_on_a_thread_of_its_own() -> None:
    """A notebook's cell runs inside an event loop, where ``asyncio.run`` is refused:
    ``run_here`` (``warm``'s and ``bench``'s) then runs the coroutine on a thread of its
    own, and still returns only once that thread's helpers have ended."""

    async def work() -> tuple[int, int]:
        return threading.get_native_id(), await asyncio.to_thread(_slow_exit_here)

    async def cell() -> tuple[int, int]:
        return run_here(work())

    where, helper = asyncio.run(cell())
    assert where != threading.get_native_id()
    assert not os.path.exists(f"/proc/self/task/{helper}")
