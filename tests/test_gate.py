"""The gate for servers that close every connection: it keeps the ceiling for a server far
away, holds a server that queues its requests where a few wait, and hands places over in
order, cancellation included.  The cap on connections through a forward proxy: cut to the
connections working, grown back one at a time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._stores import _gate
from asyncloader._stores._gate import PROXY_CONNECTIONS, ConnectionCap, ConnectionGate


async def _drive(gate: ConnectionGate, latency: object, requests: int = 3000) -> list[int]:
    """64 callers through ``gate``; each answer's time is ``latency(in flight when it
    went)``.  Returns the limit after each answer."""
    limits: list[int] = []
    left = [requests]

    async def caller() -> None:
        while left[0] > 0:
            left[0] -= 1
            await gate.acquire()
            assert gate.inflight <= gate.ceiling
            at_once = gate.inflight
            await asyncio.sleep(0)  # the others go meanwhile
            gate.release(latency(at_once))  # type: ignore[operator]
            limits.append(gate.limit)

    await asyncio.gather(*(caller() for _ in range(64)))
    return limits


def test_a_far_server_keeps_the_ceiling() -> None:
    """Answers take a round trip (50 ms, a little jitter by size) however many go at once."""
    gate = ConnectionGate(16)
    limits = asyncio.run(_drive(gate, lambda n: 0.050 + 0.0005 * (n % 3)))
    assert min(limits) >= 15 and gate.limit == 16


def test_a_server_that_queues_its_requests_is_held_where_a_few_wait() -> None:
    """One request at a time at the server, 1 ms each (after 1 ms of network): an answer
    takes 1 ms more for each request in flight with it.  The limit comes down from 16 to
    where 2-4 of them wait, and stays there."""
    gate = ConnectionGate(16)
    limits = asyncio.run(_drive(gate, lambda n: 0.001 + 0.001 * n))
    assert 3 <= gate.limit <= 7
    assert max(limits[-1000:]) <= 7


def test_failed_requests_leave_the_limit_alone() -> None:
    gate = ConnectionGate(8)
    asyncio.run(_drive(gate, lambda n: None))
    assert gate.limit == 8


@settings(max_examples=50, deadline=None)
@given(ceiling=st.integers(1, 20), callers=st.integers(1, 40), cancel=st.sets(st.integers(0, 39)))
def test_places_go_in_order_never_past_the_limit_and_cancelled_waiters_pass_them_on(
    ceiling: int, callers: int, cancel: set[int]
) -> None:
    async def body() -> None:
        gate = ConnectionGate(ceiling)
        order: list[int] = []

        async def caller(i: int) -> None:
            await gate.acquire()
            try:
                assert gate.inflight <= gate.limit
                order.append(i)
                await asyncio.sleep(0)
            finally:
                gate.release(0.001)

        tasks = [asyncio.create_task(caller(i)) for i in range(callers)]
        await asyncio.sleep(0)  # all have asked
        for i in cancel:
            if i < callers:
                tasks[i].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.inflight == 0
        # Every caller not cancelled while it waited got a place, in the order they asked.
        waited_out = [i for i in range(callers) if tasks[i].cancelled() and i not in order]
        assert sorted(order + waited_out) == list(range(callers))
        assert order == sorted(order)  # first come, first served

    asyncio.run(body())


def test_a_ceiling_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="ceiling >= 1"):
        ConnectionGate(0)
    with pytest.raises(ValueError, match="start <= ceiling"):
        ConnectionGate(4, 5)


def test_a_gate_that_starts_low_grows_to_the_ceiling_for_a_far_server() -> None:
    """Started at 4 (a server not known yet): answers that take a round trip however many
    go at once say nothing queues, and the limit grows to the ceiling, never past it."""
    gate = ConnectionGate(16, 4)
    assert gate.limit == 4
    limits = asyncio.run(_drive(gate, lambda n: 0.050 + 0.0005 * (n % 3)))
    assert limits[0] == 4 and gate.limit == 16 and max(limits) == 16


@settings(max_examples=30, deadline=None)
@given(start=st.integers(1, 8), callers=st.integers(1, 40), lift_after=st.integers(0, 10))
def test_a_lifted_gate_lets_every_waiter_go_and_limits_no_more(
    start: int, callers: int, lift_after: int
) -> None:
    """A gate put in place before the server was known, lifted once an answer says it keeps
    its connections: every caller waiting goes at once, and so does every later one."""

    async def body() -> None:
        gate = ConnectionGate(16, start)
        through = asyncio.Event()
        went: list[int] = []

        async def caller(i: int) -> None:
            await gate.acquire()
            went.append(i)
            await through.wait()
            gate.release(0.001)

        tasks = [asyncio.create_task(caller(i)) for i in range(callers)]
        for _ in range(lift_after + 1):  # the callers ask (and wait)
            await asyncio.sleep(0)
        assert len(went) == min(start, callers)  # held at the start until lifted
        gate.lift()
        await asyncio.sleep(0)
        assert sorted(went) == list(range(callers)) and gate.inflight == callers
        through.set()
        await asyncio.gather(*tasks)
        assert gate.inflight == 0
        await gate.acquire()  # no waiting after: the limit is gone
        gate.release(None)

    asyncio.run(body())


# --- the cap on connections through a forward proxy ----------------------------------------


class _Clock:
    """``time.monotonic`` for the cap, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_cut_holds_the_cap_at_the_connections_working_and_it_grows_back_slowly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(_gate.time, "monotonic", clock)
    cap = ConnectionCap(32, regrow=10.0)
    assert cap.limit == 32 and PROXY_CONNECTIONS == 32 == ConnectionCap().ceiling
    cap.cut(0)  # nothing working: the proxy is away, not full
    assert cap.limit == 32
    cap.cut(7)
    assert cap.limit == 7
    cap.cut(9)  # never raised by a cut
    assert cap.limit == 7

    async def answers(n: int, ok: bool = True) -> None:
        for _ in range(n):
            await cap.acquire()
            cap.release(0.0 if ok else None)

    asyncio.run(answers(50))
    assert cap.limit == 7  # not before `regrow` seconds
    clock.now += 10.5
    asyncio.run(answers(1, ok=False))
    assert cap.limit == 7  # a failure says nothing
    asyncio.run(answers(50))
    assert cap.limit == 8  # one more, once
    for _ in range(40):
        clock.now += 10.5
        asyncio.run(answers(1))
    assert cap.limit == 32  # back to the ceiling, never past it


def test_after_a_cut_no_new_place_is_given_until_those_in_flight_fall_below_it() -> None:
    async def body() -> None:
        cap = ConnectionCap(8)
        for _ in range(8):
            await cap.acquire()
        cap.cut(3)
        waiter = asyncio.create_task(cap.acquire())
        for _ in range(5):  # 7, 6, 5, 4, 3 in flight: still not below 3
            cap.release(None)
            await asyncio.sleep(0)
            assert not waiter.done()
        cap.release(None)  # 2 in flight: the waiter's turn
        await asyncio.wait_for(waiter, 1)
        assert cap.inflight == 3

    asyncio.run(body())
