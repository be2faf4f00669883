"""The precise timer: waits that never end early, in order, on any loop, cancellable,
its thread gone when idle and started afresh in a forked child."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import pytest

from asyncloader._base._timer import PreciseTimer, precise_sleep


def test_waits_never_end_before_they_are_due_and_end_in_due_order() -> None:
    """The waits end in the order they are due; a wait of 0 returns at once, without a turn
    of the loop (so first, even where a busy machine started it after another's due time:
    it is not queued behind that one)."""
    timer = PreciseTimer()
    ended: list[tuple[float, float, float]] = []  # (seconds, due, ended)

    async def wait(seconds: float) -> None:
        due = time.monotonic() + seconds
        await timer.sleep(seconds)
        ended.append((seconds, due, time.monotonic()))

    async def body() -> None:
        await asyncio.gather(*(wait(s) for s in (0.03, 0.001, 0.02, 0.0071, 0.01, 0.0)))

    asyncio.run(body())
    assert len(ended) == 6
    assert all(end >= due for _, due, end in ended)
    assert ended[0][0] == 0.0
    dues = [due for _, due, _ in ended[1:]]
    assert dues == sorted(dues)


def test_a_cancelled_wait_leaves_the_others_and_the_timer_working() -> None:
    timer = PreciseTimer()

    async def body() -> list[str]:
        done: list[str] = []

        async def wait(name: str, seconds: float) -> None:
            await timer.sleep(seconds)
            done.append(name)

        first = asyncio.create_task(wait("cancelled", 0.02))
        second = asyncio.create_task(wait("kept", 0.03))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        await asyncio.sleep(0.03)  # past the cancelled wait's due time: nothing breaks
        await wait("after", 0.005)
        return done

    assert asyncio.run(body()) == ["kept", "after"]


def test_one_timer_serves_loops_in_several_threads() -> None:
    timer = PreciseTimer()
    results: list[bool] = []

    def loop_thread() -> None:
        async def body() -> bool:
            t0 = time.monotonic()
            for _ in range(5):
                await timer.sleep(0.004)
            return time.monotonic() - t0 >= 0.02

        results.append(asyncio.run(body()))

    threads = [threading.Thread(target=loop_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [True, True, True]


def test_the_thread_ends_when_idle_and_the_next_wait_starts_another() -> None:
    timer = PreciseTimer(idle=0.05)
    asyncio.run(timer.sleep(0.001))
    first = timer._thread
    assert first is not None
    first.join(5)
    assert not first.is_alive() and timer._thread is None
    asyncio.run(timer.sleep(0.001))
    assert timer._thread is not None and timer._thread is not first


def _child_waits(out: multiprocessing.Queue[bool]) -> None:  # type: ignore[type-arg]
    async def body() -> bool:
        due = time.monotonic() + 0.01
        await precise_sleep(0.01)
        return time.monotonic() >= due

    out.put(asyncio.run(body()))


def test_a_forked_child_waits_on_a_timer_of_its_own() -> None:
    """The parent's timer thread is running (a wait is pending) when the child is forked:
    the child, which has no such thread, starts its own."""

    async def parent() -> bool:
        pending = asyncio.ensure_future(precise_sleep(0.3))
        await asyncio.sleep(0.01)  # the parent's thread now waits for that one
        ctx = multiprocessing.get_context("fork")
        out: multiprocessing.Queue[bool] = ctx.Queue()  # type: ignore[type-arg]
        child = ctx.Process(target=_child_waits, args=(out,))
        child.start()
        got = await asyncio.get_running_loop().run_in_executor(None, out.get, True, 10)
        child.join(10)
        await pending
        return bool(got) and child.exitcode == 0

    assert asyncio.run(parent())
