"""The gate for servers that close every connection: it keeps the ceiling for a server far
away, holds a server that queues its requests where a few wait, and hands places over in
order, cancellation included."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._stores._gate import ConnectionGate


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
