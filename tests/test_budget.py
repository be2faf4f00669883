"""The adaptive in-flight budget: Little's law for the need, AIMD on throttling, and a
loader against a rate-limited server backing off instead of hammering it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._budget import MIN_NEED, InflightBudget, Permit
from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    ceiling=st.integers(1, 200),
    floor=st.integers(1, 50),
    ops=st.lists(st.sampled_from(["take", "ok", "fail", "throttle", "tick"]), max_size=300),
)
def test_the_limit_stays_within_floor_and_ceiling(ceiling: int, floor: int, ops: list[str]) -> None:
    async def body() -> None:
        clock = Clock()
        budget = InflightBudget(ceiling, floor=floor, rate=lambda: 50.0, clock=clock)
        held: list[Permit] = []
        for op in ops:
            if op == "take" and budget.inflight < budget.limit:
                held.append(await budget.acquire())
            elif op in ("ok", "fail") and held:
                budget.release(held.pop(0), answered=op == "ok")
            elif op == "throttle" and held:
                budget.throttled(held[0].generation)
            elif op == "tick":
                clock.now += 0.01
            assert min(floor, ceiling) <= budget.limit <= ceiling
            assert 0 <= budget.inflight == len(held)

    _run(body())


def test_a_throttle_backs_off_once_per_round_then_recovers_by_one_per_window() -> None:
    async def body() -> None:
        budget = InflightBudget(64, floor=2, start=None)
        permits = [await budget.acquire() for _ in range(40)]
        # Every request of the round is throttled: one back-off, to half the flight.
        assert [budget.throttled(p.generation) for p in permits] == [True] + [False] * 39
        assert budget.window == 20 and budget.limit == 20 and budget.generation == 1
        for p in permits:
            budget.release(p, answered=False)
        # A request sent after the back-off and throttled too: the next halving.
        p = await budget.acquire()
        assert budget.throttled(p.generation) and budget.limit == 2  # 0.5 × 1, at the floor
        budget.release(p, answered=False)
        # Additive increase below where the store said no (40): one slot per window of
        # answers; window w after n answers at full use: w² ≈ w0² + 2n, 20 → 24.5 in 100.
        budget = InflightBudget(64, floor=2, start=None)
        held = [await budget.acquire() for _ in range(40)]
        budget.throttled(held[0].generation)
        for _ in range(100):
            budget.release(held.pop(0), answered=True)
            while budget.inflight < budget.limit:
                held.append(await budget.acquire())
        assert 24 <= budget.window <= 25

    _run(body())


def test_slow_start_doubles_per_round_until_the_first_throttle() -> None:
    async def body() -> None:
        budget = InflightBudget(100, floor=2, start=16)
        held: list[Permit] = []

        async def answers(n: int) -> None:  # in steady state: each answer's slot refilled
            for _ in range(n):
                while budget.inflight < budget.limit:
                    held.append(await budget.acquire())
                budget.release(held.pop(0), answered=True)

        for answered, expected in ((16, 32), (32, 64), (36, 100)):
            await answers(answered)
            assert budget.limit == expected
        flight = budget.inflight
        assert budget.throttled(held[-1].generation)
        w0 = budget.window
        assert w0 == flight / 2
        await answers(int(w0))  # one window of answers: one slot more
        assert w0 + 0.9 < budget.window < w0 + 1.1

    _run(body())


def test_past_the_last_throttle_the_window_probes_gently_then_climbs() -> None:
    async def body() -> None:
        budget = InflightBudget(1000, floor=2, start=None)
        held = [await budget.acquire() for _ in range(40)]
        budget.throttled(held[0].generation)  # the store said no at 40: window 20

        async def window_of_answers() -> float:  # steady state; returns the growth
            w = budget.window
            for _ in range(int(w)):
                budget.release(held.pop(0), answered=True)
                while budget.inflight < budget.limit:
                    held.append(await budget.acquire())
            return budget.window - w

        while budget.window < 39:
            assert 0.9 < await window_of_answers() < 1.1  # additive back to 40
        await window_of_answers()  # the one that crosses 40
        growth = [await window_of_answers() for _ in range(15)]
        assert growth[0] < 0.2  # gently where the store said no
        assert growth[-1] > 0.9  # and fast again once it keeps saying yes
        assert growth == sorted(growth)

    _run(body())


def test_the_window_does_not_grow_while_it_is_not_what_limits() -> None:
    async def body() -> None:
        budget = InflightBudget(64, floor=2, start=None)
        p = await budget.acquire()
        budget.throttled(p.generation)  # window 2 (floor)
        budget.release(p, answered=False)
        budget.window = 16.0
        for _ in range(100):  # one request at a time: the window is not used
            budget.release(await budget.acquire(), answered=True)
        assert budget.window == 16.0

    _run(body())


def test_littles_law_sizes_the_need_from_rate_and_time_in_flight() -> None:
    async def body() -> None:
        clock = Clock()
        rate: list[float | None] = [None]
        budget = InflightBudget(
            500, headroom=2.0, rate=lambda: rate[0], clock=clock, samples=64, start=None
        )

        async def round_trip(seconds: float, n: int) -> None:
            for _ in range(n):
                p = await budget.acquire()
                clock.now += seconds
                budget.release(p, answered=True)

        await round_trip(0.125, 64)
        assert budget.limit == 500  # the rate is not known yet: the ceiling
        rate[0] = 100.0  # requests/s
        await round_trip(0.125, 64)
        assert budget.limit == 25  # 2 × 100/s × 0.125 s
        await round_trip(0.5, 64)  # latency rises: so does the need
        assert budget.limit == 100
        await round_trip(1 / 1024, 64)
        assert budget.limit == MIN_NEED  # not the couple Little's law says

    _run(body())


def test_waiters_are_served_in_order_and_a_cancelled_one_leaks_nothing() -> None:
    async def body() -> None:
        budget = InflightBudget(2, floor=2)
        a, b = await budget.acquire(), await budget.acquire()
        order: list[int] = []

        async def take(i: int) -> None:
            p = await budget.acquire()
            order.append(i)
            await asyncio.sleep(0)
            budget.release(p, answered=True)

        tasks = [asyncio.create_task(take(i)) for i in range(5)]
        await asyncio.sleep(0)
        tasks[1].cancel()
        budget.release(a, answered=True)
        budget.release(b, answered=True)
        await asyncio.gather(*tasks, return_exceptions=True)
        assert order == [0, 2, 3, 4]
        assert budget.inflight == 0

    _run(body())


def _loader(server: S3TestServer, adaptive: bool) -> al.ImageLoader:
    return al.ImageLoader(
        "s3://data/train/",
        batch_size=16,
        decode_workers=2,
        decode_backend="thread",
        transform=al.CenterCrop(32),
        shuffle=False,
        fetch=al.FetchConfig(adaptive=adaptive, max_inflight=64, backoff_base=0.02),
        store_options={"endpoint_url": server.endpoint},
    )


def test_a_rate_limited_server_sees_the_budget_shrink(jpeg_folder: Path) -> None:
    throttled = {}
    with S3TestServer(latency=0.03, load=jpeg_folder, bucket="data", prefix="train/") as srv:
        for adaptive in (False, True):
            srv.set_faults(rate_limit=100, burst=4)
            before = srv.stats()["counters"].get("rate_limited", 0)
            with _loader(srv, adaptive) as loader:
                labels = [int(x) for _, lab in loader for x in lab]
            stats = loader.stats()
            assert len(labels) == N_IMAGES and stats.skipped == {}  # nothing lost
            throttled[adaptive] = srv.stats()["counters"].get("rate_limited", 0) - before
            assert 0 < stats.retries["throttled"] <= throttled[adaptive]  # retried, not lost
            if adaptive:
                assert stats.backoffs >= 1
                assert stats.inflight_limit < stats.max_inflight == 64
            else:
                assert stats.backoffs == 0 and stats.inflight_limit == 64
    # A fixed 64 in flight against 100 requests/s: most requests are refused; backing off,
    # far fewer.
    assert throttled[True] * 3 < throttled[False]


@pytest.mark.parametrize("bad", [{"min_inflight": 0}, {"throttle_decrease": 1.0}])
def test_bad_budget_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="min_inflight"):
        al.FetchConfig(**bad)  # type: ignore[arg-type]
