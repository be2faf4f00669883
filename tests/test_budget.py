"""The adaptive in-flight budget: Little's law for the need, AIMD on throttling, and a
loader against a rate-limited server backing off instead of hammering it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._base._budget import MIN_NEED, InflightBudget, Permit
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


def test_a_throttle_in_the_first_second_paces_at_the_rate_answers_came() -> None:
    """The pace a throttle sets is the rate the store answered at: in the run's first
    second, over the time since the first answer, not over a whole second (8 answers in
    50 ms are 140 a second, not 8: paced at 7 a second, a run of 96 images throttled at
    random took a minute instead of half a second)."""

    async def body() -> None:
        clock = Clock()
        budget = InflightBudget(64, floor=2, start=None, clock=clock)
        held = [await budget.acquire() for _ in range(10)]
        for _ in range(8):
            clock.now += 0.00625
            budget.release(held.pop(0), answered=True)
        assert budget.throttled(held[0].generation)
        assert budget.pace == pytest.approx(0.9 * 7 / 0.04375)  # PACE_DECREASE × 160 a second
        # A second later, over the last second as before.
        clock.now += 1.0
        for _ in range(20):
            clock.now += 0.01
            budget.release(held.pop(0), answered=True) if held else None
            held.append(await budget.acquire())
        assert 10 <= budget._answer_rate() <= 20

    _run(body())


def test_answers_an_event_loop_took_late_leave_no_floor_above_what_the_store_served() -> None:
    """Answers that arrive bunched (the loop was busy while the store answered them) may
    set a pace far above a strict limiter's rate (4 answers in 0.3 ms look like 10,000 a
    second), but the floor under the pace is what the store served (their number over the
    time since their requests went), and the first cut, once the pace is seen refused,
    goes to near that (twice it): a strict limiter at 150 a second then refuses a few
    requests of each cut's judging, not half of them.  (With the floor at half of 10,000 a second, nginx's limit_req at 150 a
    second refused more than half of a run.)  Likewise a slow store's two answers."""

    async def body() -> None:
        clock = Clock()
        budget = InflightBudget(64, floor=2, start=16, clock=clock)
        held = [await budget.acquire() for _ in range(16)]
        clock.now = 0.2  # the loop comes back: 4 answers and the refusals, all at once
        for _ in range(4):
            clock.now += 0.0001
            budget.release(held.pop(), answered=True)
        assert budget.throttled(held[0].generation)
        assert budget.pace > 1000  # (what the bunched answers looked like)
        assert budget._best_served == pytest.approx(3 / 0.2004)
        for p in held:
            budget.release(p, answered=False)
        # Paced requests, one at a time, at a strict limiter of 150 a second.
        last_taken, refused = 0.2, 0
        for _ in range(300):
            permit = await budget.acquire()
            clock.now += 0.001  # the request's way there and back
            if clock.now - last_taken >= 1 / 150:
                last_taken = clock.now
                budget.release(permit, answered=True)
            else:
                refused += 1
                budget.throttled(permit.generation)
                budget.release(permit, answered=False)
            clock.now += 1 / budget.pace if budget.pace else 0.001
        assert budget.pace <= 150 and refused < 300 / 4
        # A slow store: two answers in all, two seconds after their requests went, taken
        # in one late turn of the loop: about one every two seconds, not 10,000 a second.
        budget = InflightBudget(64, floor=2, start=16, clock=clock)
        sent = clock.now
        held = [await budget.acquire() for _ in range(4)]
        clock.now = sent + 2.0
        budget.release(held.pop(), answered=True)
        clock.now += 0.0001
        budget.release(held.pop(), answered=True)
        assert budget._served_rate() == pytest.approx(1 / 2.0001)
        assert budget.throttled(held[0].generation)
        assert budget._best_served < 1.0

    _run(body())


@settings(max_examples=150, deadline=None)
@given(
    rate=st.sampled_from([50.0, 150.0, 400.0]),
    requests=st.lists(
        st.tuples(
            st.floats(0.0, 0.02),  # the wait before the next request goes
            st.floats(0.0, 0.005),  # its way to the server
            st.floats(0.0, 0.25),  # the answer's way back, a busy event loop's lateness in it
        ),
        min_size=2,
        max_size=80,
    ),
)
def test_what_the_store_served_stays_within_a_strict_limiter_s_rate_however_late_answers_come(
    rate: float, requests: list[tuple[float, float, float]]
) -> None:
    """Against a strict limiter (a request is taken only ``1 / rate`` or more after the last
    one taken, else refused), whatever the answers' lateness on their way back: the rate
    the budget says the store served, and so the floor under the pace, stay within the
    limiter's rate, give or take the answers of the longest lateness (at most 0.25 s of
    them in a second's count); a cut of the pace leaves it within twice that."""

    async def body() -> None:
        clock = Clock()
        budget = InflightBudget(1000, floor=2, start=None, clock=clock)
        answers: list[tuple[float, int, Permit, bool]] = []  # a heap, by arrival
        bound = rate * 1.25 + 1.0
        sent, last_taken = 0.0, -1.0
        for i, (gap, way, back) in enumerate([*requests, (1.0, 0.0, 0.0)]):
            sent += gap
            while answers and answers[0][0] <= sent:  # the answers that came before it
                when, _, permit, taken = heapq.heappop(answers)
                clock.now = when
                if not taken:
                    pace = budget.pace
                    budget.throttled(permit.generation)
                    if 0 < pace != budget.pace:  # a cut of the pace: near what it served
                        assert budget.pace <= 2 * bound
                budget.release(permit, answered=taken)
                assert budget._served_rate() <= bound and budget._best_served <= bound
            clock.now = sent
            if i == len(requests) or budget.inflight >= budget.limit:
                continue  # (the last: no request, the answers' turn)
            permit = await budget.acquire()
            at_server = sent + way
            taken = at_server - last_taken >= 1.0 / rate
            last_taken = at_server if taken else last_taken
            heapq.heappush(answers, (at_server + back, i, permit, taken))

    _run(body())


def test_a_paced_budget_cuts_its_pace_only_for_refusals_the_rate_makes() -> None:
    """Once paced, a refusal now and then (a request arriving a little early at a strict
    limiter) leaves the pace where it is and backs off the window; ``PACE_REFUSALS`` among
    the last ``PACE_JUDGED`` paced requests cut it by ``PACE_DECREASE``, and the next cut is
    judged afresh at the new pace."""
    from asyncloader._base._budget import PACE_DECREASE, PACE_JUDGED, PACE_REFUSALS

    async def body() -> None:
        clock = Clock()
        budget = InflightBudget(64, floor=2, start=None, clock=clock)
        held = [await budget.acquire() for _ in range(8)]

        async def answers(n: int) -> None:  # n answers, 10 ms apart, slots refilled
            for _ in range(n):
                clock.now += 0.01
                budget.release(held.pop(0), answered=True)
                while budget.inflight < budget.limit:
                    held.append(await budget.acquire())

        await answers(50)
        assert budget.throttled(budget.generation)  # the first refusal sets the pace
        first = budget.pace
        assert first > 0
        # Sparse refusals, one per 40 answers: 5 or 6 in any 200, fewer than PACE_REFUSALS.
        for _ in range(10):
            await answers(39)
            pace, window = budget.pace, budget.window
            assert budget.throttled(budget.generation)  # a back-off of the window...
            assert budget.window < window
            assert budget.pace == pace  # ...not of the pace
        assert budget.pace >= first
        # Dense refusals: the PACE_REFUSALS-th within PACE_JUDGED cuts the pace.
        cut = None
        for i in range(PACE_REFUSALS):
            await answers(PACE_JUDGED // (2 * PACE_REFUSALS))
            pace = budget.pace
            budget.throttled(budget.generation)
            if budget.pace < pace:
                cut = (i, pace)
                break
        assert cut is not None, "dense refusals never cut the pace"
        assert budget.pace == pytest.approx(PACE_DECREASE * cut[1])
        # Judged afresh: the next refusal alone does not cut again.
        await answers(5)
        pace = budget.pace
        assert budget.throttled(budget.generation) and budget.pace == pace

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


def test_a_newcomer_never_goes_ahead_of_a_waiter_already_granted() -> None:
    """A release that grows the window grants the waiter and leaves a slot over; a task
    that asks next, scheduled before the granted waiter resumes, queues behind it (requests
    go out first come, first served: a later batch's never ahead of an earlier one's)."""

    async def body() -> None:
        budget = InflightBudget(8, floor=1, start=2)
        a, b = await budget.acquire(), await budget.acquire()
        order: list[int] = []

        async def take(i: int) -> None:
            p = await budget.acquire()
            order.append(i)
            budget.release(p, answered=True)

        waiter = asyncio.create_task(take(0))
        await asyncio.sleep(0)  # it waits: 2 of 2 in flight
        late = asyncio.create_task(take(1))  # runs before the granted waiter resumes
        budget.release(a, answered=True)  # the window grows to 3: granted, one slot over
        await asyncio.gather(waiter, late)
        assert order == [0, 1]
        budget.release(b, answered=True)
        assert budget.inflight == 0

    _run(body())


def _loader(server: S3TestServer, adaptive: bool) -> al.ImageLoader:
    return al.ImageLoader(
        "s3://data/train/",
        batch_size=16,
        transform=al.CenterCrop(32),
        shuffle=False,
        fetch=al.FetchConfig(adaptive=adaptive, max_inflight=64, backoff_base=0.02),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),
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


def _steady(budget: InflightBudget, held: list[Permit], answers: int, clock: Clock) -> Any:
    """``answers`` answers in steady state (each slot refilled), 10 ms apart."""

    async def run() -> None:
        for _ in range(answers):
            while budget.inflight < budget.limit:
                held.append(await budget.acquire())
            clock.now += 0.01
            budget.release(held.pop(0), answered=True)

    return run()


def test_the_loaders_of_a_node_back_off_together_and_share_the_growth(tmp_path: Path) -> None:
    """Two budgets sharing a node file: a throttle in one is a back-off of both (the other
    follows at its next look), a second throttle of the same round is not a second
    back-off, and after it each grows by half the step a lone budget grows by."""
    from asyncloader._base._budget import NODE_POLL
    from asyncloader._base._node_share import NodeShare

    async def body() -> None:
        clock, wall = Clock(), Clock()
        wall.now = 1e9
        path = tmp_path / "node.budget"
        a_node, b_node = (NodeShare(path, clock=wall) for _ in range(2))
        a, b = (
            InflightBudget(64, floor=2, start=None, clock=clock, node=n) for n in (a_node, b_node)
        )
        alone = InflightBudget(64, floor=2, start=None, clock=clock)
        held: dict[int, list[Permit]] = {id(x): [] for x in (a, b, alone)}
        for x in (a, b, alone):
            await _steady(x, held[id(x)], 64, clock)
            assert x.limit == 64
        clock.now += NODE_POLL
        wall.now += 0.001
        half = 0.5 * min(64, a.inflight)  # 63 in flight: one answer's slot not refilled
        assert a.throttled(held[id(a)][-1].generation)
        assert a.window == half and a.followed == 0
        # b is throttled in the same round: the node backed off for it already, b follows.
        assert b.throttled(held[id(b)][-1].generation)
        assert b.window == half and b.followed == 0
        assert not a.throttled(a.generation)  # no back-off twice for the one round
        # A later round: b is throttled again; a follows it at its next look.
        wall.now += 1.0
        assert b.throttled(b.generation) and b.window == half / 2
        clock.now += NODE_POLL
        a.release(held[id(a)].pop(0), answered=True)
        assert a.followed == 1 and a.members == 2
        assert half / 2 <= a.window < half / 2 + 0.1  # (and this answer's growth)
        # Growth below the last throttle: one slot per window of answers alone, half that
        # for each of two members (together, one).
        assert alone.throttled(held[id(alone)][-1].generation)
        alone.window = a.window = 16.0
        alone._wmax = a._wmax = 64.0
        for x in (a, alone):
            del held[id(x)][16:]
            x.inflight = len(held[id(x)])
            await _steady(x, held[id(x)], 64, clock)
        assert 19.5 < alone.window < 20.5  # w² ≈ 16² + 2 × 64
        assert 17.5 < a.window < 18.5  # w² ≈ 16² + 64
        for n in (a_node, b_node):
            n.close()

    _run(body())


def test_a_node_member_that_stopped_beating_no_longer_counts(tmp_path: Path) -> None:
    from asyncloader._base._node_share import NodeShare

    wall = Clock()
    wall.now = 1e9
    path = tmp_path / "n" / "node.budget"  # the folder is made
    first, second = NodeShare(path, clock=wall, stale=10), NodeShare(path, clock=wall, stale=10)
    assert first.poll() == (0, 2)
    wall.now += 11  # second was killed without a word
    assert first.poll() == (0, 1)
    third = NodeShare(path, clock=wall, stale=10)  # takes a slot again
    assert third.poll() == (0, 2)
    assert second.poll() == (0, 3)  # back: it takes a slot of its own again
    assert first.back_off(gap=1.0) == 1 and third.back_off(gap=1.0) == 1  # one round
    wall.now += 2
    assert third.back_off(gap=1.0) == 2
    for share in (first, second, third):
        share.close()
        share.close()  # idempotent
    reopened = NodeShare(path, clock=wall)
    assert reopened.poll() == (2, 1) and reopened.generation == 2
    reopened.close()
    path.write_bytes(b"not a node file")  # another version's, or damaged: started anew
    fresh = NodeShare(path, clock=wall)
    assert fresh.poll() == (0, 1)
    fresh.close()


def test_fetchers_reading_one_url_into_one_cache_folder_share_their_back_offs(
    tmp_path: Path, jpeg_folder: Path
) -> None:
    """The real fetchers, through the node file in the cache folder: a throttled answer
    in one is a back-off in the other; with ``node_budget=False`` it is not."""
    from asyncloader._base._budget import NODE_POLL
    from asyncloader._base._stats import Counters
    from asyncloader._dataset._saved import budget_path
    from asyncloader._fetch import Fetcher
    from asyncloader.testing import FaultyStore, MemoryBucket, MemoryStore

    bucket = MemoryBucket({f"k{i}": bytes([i]) * 100 for i in range(32)})
    cache = al.ObjectCache(tmp_path / "cache")

    async def body(shared: bool) -> tuple[int, int, int]:
        config = al.FetchConfig(max_inflight=64, backoff_base=0.001, node_budget=shared)
        throttling = FaultyStore(MemoryStore(bucket))
        a, b = (
            Fetcher(store, Counters(), config, node=budget_path(cache.directory, store.url))
            for store in (throttling, MemoryStore(bucket))
        )
        try:
            objects = [al.ObjectInfo(k, 100, bucket.get(k)[1]) for k in bucket.sorted_keys()]  # type: ignore[index]
            throttling.fail_next(1, "k1")
            assert bytes(await a.fetch(objects[1])) == bytes([1]) * 100  # retried
            await asyncio.sleep(2 * NODE_POLL)
            for o in objects:  # b's answers: it looks at the node
                await b.fetch(o)
                await asyncio.sleep(NODE_POLL / 8)
            return a.budget.generation, b.budget.followed, b._c.node_loaders
        finally:
            a.close()
            b.close()

    assert _run(body(True)) == (1, 1, 2)
    assert _run(body(False)) == (1, 0, 0)
    # A loader with a cache folder is a member of its node's budget.
    with S3TestServer(load=jpeg_folder, bucket="data", prefix="train/") as srv:
        with al.ImageLoader(
            "s3://data/train/",
            batch_size=16,
            transform=al.CenterCrop(32),
            cache_dir=tmp_path / "loader-cache",
            store=al.StoreConfig(options={"endpoint_url": srv.endpoint}),
        ) as loader:
            assert sum(len(lab) for _, lab in loader) == N_IMAGES
            assert loader.stats().node_loaders == 1


def test_a_node_file_that_cannot_be_made_leaves_the_loader_on_its_own(tmp_path: Path) -> None:
    from asyncloader._base._stats import Counters
    from asyncloader._fetch import Fetcher
    from asyncloader.testing import MemoryStore

    (tmp_path / "not-a-folder").write_bytes(b"")
    with pytest.warns(RuntimeWarning, match="not shared with the node"):
        fetcher = Fetcher(
            MemoryStore({"k": b"v"}),
            Counters(),
            al.FetchConfig(),
            node=tmp_path / "not-a-folder" / "x.budget",
        )
    assert bytes(_run(fetcher.fetch(al.ObjectInfo("k", 1)))) == b"v"  # type: ignore[arg-type]
    fetcher.close()


def test_a_late_turn_is_made_up_over_the_next_turns_never_by_one_early_request() -> None:
    """Paced at 100 a second, a request whose wait ended 6 ms late (a busy loop): the next
    one goes ``PACE_GAP`` of a turn after it, not at its own turn 4 ms later (a strict
    limiter counts from the request it took last, and would refuse it); the turns after
    it come ``PACE_GAP`` of a turn apart until the schedule is met again."""
    from asyncloader._base._budget import PACE_GAP

    clock = Clock()
    late = [0.006]

    async def sleep(seconds: float) -> None:
        clock.now += seconds + (late.pop() if late else 0.0)

    async def body() -> list[float]:
        budget = InflightBudget(64, floor=2, start=None, clock=clock, sleep=sleep)
        budget.pace = 100.0
        sent = []
        for _ in range(30):
            await budget.acquire()
            sent.append(clock.now)
        return sent

    sent = _run(body())
    assert isinstance(sent, list)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= PACE_GAP * 0.01 - 1e-9
    assert gaps[1] == pytest.approx(PACE_GAP * 0.01)  # right after the late one
    assert sent[0] == pytest.approx(0.016)  # the first turn, 6 ms late
    assert sent[-1] == pytest.approx(0.30)  # on schedule again: the 30th turn at 300 ms


def test_a_waiter_cancelled_just_before_a_release_ends_cancelled() -> None:
    """A waiting acquire is cancelled, and a slot is released before the cancelled task
    runs again: the release passes the cancelled waiter over, and the task ends with
    CancelledError (not a ValueError from removing a waiter already gone), its slot never
    counted."""

    async def body() -> None:
        budget = InflightBudget(1, floor=1, start=1)
        held = await budget.acquire()
        waiter = asyncio.create_task(budget.acquire())
        await asyncio.sleep(0)  # it waits for the one slot
        waiter.cancel()
        budget.release(held, answered=True)  # before the waiter's task runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert budget.inflight == 0
        permit = await budget.acquire()  # the slot is free
        budget.release(permit, answered=True)

    _run(body())
