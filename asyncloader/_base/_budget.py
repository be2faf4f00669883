"""The adaptive in-flight budget: how many requests a fetcher may have in flight now.

Two bounds, the smaller wins, always between ``floor`` and ``ceiling``:

* **What is needed** (Little's law): requests in flight = rate × time each holds a slot.  The
  rate is what the consumer (decode) can absorb, the time is measured over the last requests;
  times ``headroom`` for bursts.  It grows when latency rises, and shrinks when the store is
  fast, so a well-behaved store is not sent more requests than decode can use.
  Never below ``MIN_NEED``: on a store answering in a millisecond, Little's law asks for a
  couple of requests, and the event loop's own pauses would then show.
* **What the store takes** (AIMD, as TCP does): the window starts at ``start`` and grows by
  one per answer (doubling per round of requests) up to the ceiling, until the first
  throttled answer (503 SlowDown, 429).  A throttle multiplies the window by ``decrease`` —
  once per round: only a throttle of a request sent after the last back-off counts again —
  and from then on each answer adds ``1 / window`` (one slot per window of answers) up to
  where the store last throttled; past it, ``PROBE`` times that at first, rising to the
  full step over about ten windows of answers (a store that throttled at a window is
  probed gently there, one that stopped throttling is soon climbed fast again, as CUBIC
  does).  The window grows only while it is what limits.
* **How fast the store takes them** (a pace): a store that limits the request *rate*
  without a burst (nginx's ``limit_req``, a leaky bucket) refuses a request sent sooner
  than ``1 / rate`` after the last, whatever the window.  On a back-off, requests are
  paced at ``PACE_DECREASE`` × the pace (the first time: × the rate the store answered at
  over the last second, or since its first answer where that came within it).  Each
  answer then raises the pace: quickly back to just below where the store last refused
  (``PACE_NEAR`` of it, within about a second), then by
  ``PACE_GROWTH`` of itself per second, a probe that doubles every few seconds without a
  refusal (as CUBIC does): a strict limiter is held just below its rate and refused now
  and then, and a store that stopped limiting is soon climbed again.  Once paced, a refusal
  is the rate's only when ``PACE_REFUSALS`` of the last ``PACE_JUDGED`` paced requests
  (answered or refused, this one included) were refused; the pace it cuts is then where the
  store refuses (or twice what the store served, where the pace is above that: a first
  pace set from answers that an event loop took late, bunched, is cut at once to near what
  the store took, not ``PACE_DECREASE`` at a time).  Below that, requests are paced
  right and one now and then arrives a little early (a strict limiter counts whole
  milliseconds between arrivals, and the client's and the server's scheduling move each
  arrival by about as much): such a refusal is retried as any other, stops the pace's
  probe from speeding up, and leaves the pace where it is (the window backs off).  A pace
  cut at every refusal was held well below a strict limiter's rate by such arrivals
  (``benchmarks/bench_servers.py``, RESULTS.md).
  A paced request waits for its turn on a :class:`~._timer.PreciseTimer` (asyncio's timers
  end up to a millisecond late, 7 % of a turn at 140 a second), and goes no sooner than
  ``PACE_GAP`` of a turn after the request before it.
  A pace that stays twice what is sent for ``PACE_IDLE`` seconds (it is not what limits)
  is dropped.  The pace never goes below ``PACE_FLOOR`` of the most the store served
  lately (that most halving every ``PACE_MEMORY`` seconds): refusals that do not follow
  the rate (faults, the store's own trouble) cannot spiral it down.  What it served is
  counted from its requests' going, which bunched answers cannot raise above a strict
  limiter's rate (a floor above the rate held the pace where half the requests were
  refused).

**One budget per node** (:class:`~._node_share.NodeShare`): the loaders of one node that
read one store into one cache folder — its ranks and their DataLoader workers — are, to the
store, one client.  Each backing off alone, N of them recover N times as fast as one and the
store keeps throttling.  Sharing a small file in the cache folder, a back-off of any of them
is a back-off of all (once per round of requests, node-wide), and each grows its window by
``1 / active`` of the step and goes down to ``1 / active`` of the floor, so that together
they climb, and back off, as one client does.

Asyncio, the standard library, its timer (``_timer``) and the node's file (``_node_share``)
only.  The budget runs on one event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._node_share import NodeShare
from ._timer import precise_sleep

__all__ = ["MIN_NEED", "InflightBudget", "Permit"]

MIN_NEED = 16
PROBE = 0.1
PACE_DECREASE = 0.9
PACE_FORGET = 0.97
PACE_NEAR = 0.97
PACE_GROWTH = 0.01
PACE_IDLE = 5.0
PACE_FLOOR = 0.5
PACE_MEMORY = 30.0
PACE_JUDGED = 200
PACE_REFUSALS = 8
PACE_GAP = 0.97
NODE_POLL = 0.05  # seconds between two looks at the node (while requests are answered)


@dataclass(frozen=True, slots=True)
class Permit:
    """One slot in flight: when it was taken, and the back-off generation it was sent in."""

    taken: float
    generation: int


class InflightBudget:
    """An asyncio limit on requests in flight that adapts to the need and to throttling.

    Args:
        ceiling: The most requests in flight (``max_inflight``).
        floor: The fewest the limit goes down to.
        start: The first window (grown quickly until a throttle; None: the ceiling).
        decrease: Factor applied to the window on throttling (0 < decrease < 1).
        headroom: The need is ``headroom`` × rate × time in flight.
        rate: Objects per second the consumer can absorb, or None while unknown (then only
            the window bounds the limit).
        samples: How many recent slot-hold times the mean is taken over.
        clock: Seconds, monotonic.
        sleep: Waits a number of ``clock``'s seconds (a paced request's wait); default:
            :func:`~._timer.precise_sleep` with the default clock (asyncio's own timers
            end up to a millisecond late), none with a clock of the caller's own (its
            time passes as the caller says).
        node: The node this budget is one member of (its back-offs shared, its growth and
            its floor divided among the active members); None: on its own.
    """

    def __init__(
        self,
        ceiling: int,
        *,
        floor: int = 2,
        start: int | None = 16,
        decrease: float = 0.5,
        headroom: float = 2.0,
        rate: Callable[[], float | None] | None = None,
        samples: int = 256,
        clock: Callable[[], float] = time.monotonic,
        node: NodeShare | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        if ceiling < 1 or floor < 1:
            raise ValueError("need ceiling >= 1 and floor >= 1")
        if not 0 < decrease < 1 or headroom < 1:
            raise ValueError("need 0 < decrease < 1 and headroom >= 1")
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self._decrease = decrease
        self._headroom = headroom
        self._rate = rate
        self._clock = clock
        self._sleep = sleep or (precise_sleep if clock is time.monotonic else _no_wait)
        self.window = float(min(ceiling, max(start or ceiling, self.floor)))  # AIMD
        self._slow_start = True  # until the first back-off
        self._wmax = 0.0  # the window when the store last throttled
        self._probe = PROBE  # the window's growth per window of answers past _wmax
        self.need = float(ceiling)  # Little's law: what the consumer can use
        self.inflight = 0
        self.generation = 0  # back-offs so far
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._granted = 0  # waiters given a slot that have not resumed yet
        self._holds: deque[float] = deque(maxlen=samples)
        self._hold_sum = 0.0
        self._since_sized = 0
        self._node = node
        self._node_seen = node.generation if node is not None else 0
        self.members = 1  # active members of the node (this one included)
        self.followed = 0  # back-offs made for another member's throttled answer
        self._polled = clock()
        self.pace = 0.0  # requests per second sent at most (0: not paced)
        self._pace_refused = 0.0  # the pace at the last back-off
        self._pace_probe = PACE_GROWTH  # the pace's growth per answer, past it
        self._next_send = 0.0  # when the last paced request's turn was
        self._last_sent = 0.0  # when the last paced request went
        # The last answers: when each came, and when its request went.
        self._answered: deque[tuple[float, float]] = deque(maxlen=4096)
        self._pace_slack_since: float | None = None  # since when the pace has not limited
        self._best_served = 0.0  # the most answers per second lately (see _back_off)
        self._best_at = clock()
        # The last paced requests since the last back-off: True for each one refused.
        self._judged: deque[bool] = deque(maxlen=PACE_JUDGED)

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return max(self._floor(), min(self.ceiling, int(min(self.window, self.need))))

    def _floor(self) -> int:
        """The fewest in flight: ``floor``, or in a node its share of it (the node's
        members together go down to about ``floor``, not ``floor`` each)."""
        return max(1, -(-self.floor // self.members)) if self.members > 1 else self.floor

    async def acquire(self) -> Permit:
        """Wait for a slot (first come, first served: also behind waiters that were granted
        a slot and have not run yet, whose requests would otherwise go out after this one's)."""
        if self.inflight >= self.limit or self._waiters or self._granted:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._granted -= 1
                    self.inflight -= 1  # granted as it was cancelled: give the slot back
                    self._wake()
                elif fut in self._waiters:  # (a release may have passed it over already)
                    self._waiters.remove(fut)
                raise
            self._granted -= 1
            self._wake()  # those queued behind this one while it was granted
        else:
            self.inflight += 1
        if self.pace > 0:
            try:
                await self._paced()
            except BaseException:
                self.inflight -= 1  # cancelled while paced: the slot goes back
                self._wake()
                raise
        return Permit(self._clock(), self.generation)

    async def _paced(self) -> None:
        """Wait until ``1 / pace`` after the last request's turn.  A turn taken late (a
        timer's overshoot, a busy loop) counts from when it was due, so the pace does not
        drift below itself, but never from more than half a turn back, and a request never
        goes sooner than ``PACE_GAP`` of a turn after the last one went: a late turn is made
        up over the next few, not by the next one alone, which a strict limiter would
        refuse (it counts from the last request it took)."""
        planned = max(self._next_send + 1.0 / self.pace, self._clock() - 0.5 / self.pace)
        self._next_send = planned  # this request's turn, taken now (others queue behind)
        left = planned - self._clock()
        if left > 0:
            await self._sleep(left)
        if self.pace > 0:  # (a pace dropped while this one waited leaves nothing to wait)
            left = self._last_sent + PACE_GAP / self.pace - self._clock()
            if left > 0:
                await self._sleep(left)
        self._last_sent = self._clock()

    def release(self, permit: Permit, *, answered: bool) -> None:
        """Give the slot back; ``answered``: the store answered (not throttled, not a
        transport failure), which grows the window while the window is what limits."""
        flight = self.inflight
        self.inflight -= 1
        hold = self._clock() - permit.taken
        if len(self._holds) == self._holds.maxlen:
            self._hold_sum -= self._holds[0]
        self._holds.append(hold)
        self._hold_sum += hold
        if answered and self.window < self.ceiling and flight >= int(self.window):
            if self._slow_start:
                step = 1.0
            elif self.window < self._wmax:
                step = 1.0 / (self.window * self.members)
            else:  # past where the store last throttled: probe slowly, then faster
                step = self._probe / (self.window * self.members)
                self._probe = min(1.0, self._probe * (1.0 + 0.25 / self.window))
            self.window = min(float(self.ceiling), self.window + step)
        if answered:
            self._answered.append((self._clock(), permit.taken))
            if self.pace > 0:
                self._judged.append(False)
                self._grow_pace()
        self._since_sized += 1
        if self._since_sized >= 16:
            self._size()
        if self._node is not None and self._clock() - self._polled >= NODE_POLL:
            self._poll_node()
        self._wake()

    def throttled(self, generation: int) -> bool:
        """A request sent in ``generation`` was throttled: back off, once per generation
        (and, in a node, once per node-wide back-off: a member throttled in the round the
        node backed off for another only follows it).  Returns whether this backed off."""
        if generation != self.generation or self.floor == self.ceiling:
            return False  # sent before the last back-off (that one answered for it), or fixed
        if self._node is not None:
            node_generation = self._node.back_off(gap=self._round())
            if node_generation <= self._node_seen:
                return False  # the node's back-off for this round was applied here already
            self._node_seen = node_generation
        self._back_off()
        return True

    def _rate_refused(self) -> bool:
        """A paced request refused: whether the pace is what the store refuses
        (``PACE_REFUSALS`` of the last ``PACE_JUDGED`` paced requests, this one included),
        not one request's early arrival (see the module's docstring).  An early arrival
        stops the pace's probe from speeding up."""
        self._judged.append(True)
        if sum(self._judged) >= PACE_REFUSALS:
            return True
        self._pace_probe = PACE_GROWTH
        return False

    def _round(self) -> float:
        """One round of requests [seconds]: the mean time a request holds its slot."""
        mean = self._hold_sum / len(self._holds) if self._holds else 0.1
        return min(2.0, max(0.02, mean))

    def _poll_node(self) -> None:
        """Follow the node: back off for a back-off of another member not applied here
        yet, and learn how many members share the growth."""
        assert self._node is not None
        self._polled = self._clock()
        node_generation, self.members = self._node.poll()
        if node_generation > self._node_seen and self.floor != self.ceiling:
            self._node_seen = node_generation
            self.followed += 1
            self._back_off()

    def _recent(self, now: float) -> int:
        """How many answers came in the last second: counted from the newest back (they
        are in the order they came), not over all that are kept — this runs for every
        answer while paced."""
        n = 0
        for came, _ in reversed(self._answered):
            if now - came > 1.0:
                break
            n += 1
        return n

    def _served_rate(self) -> float:
        """Answers per second lately: the answers that came in the last second (the last
        16, where fewer than 8 did), over the time from the first of their requests' going
        to the last answer's coming.

        Over that span, not over the span between the answers' arrivals: answers that an
        event loop took late (a busy engine, a loaded machine) arrive bunched, and 4 of
        them in a millisecond are not 3,000 a second.  Such an estimate paced a strict rate
        limiter's requests far above its rate, and the floor it left under the pace
        (``PACE_FLOOR`` of the most served) held them there: more than half were refused.
        Every request counted went no sooner than the span's start and was answered by its
        end, so however late its answer came, a strict limiter's rate bounds the estimate
        (one answer less than counted: the first may have been served at the start).  A
        request's time waiting for the store counts in: at a run's start, 8 answers to
        requests sent 50 ms before are 140 a second, as they are to the store."""
        answered = self._answered
        if len(answered) < 2:
            return 0.0
        recent = self._recent(self._clock())
        counted = recent if recent >= 8 else min(len(answered), 16)
        first_sent = min(sent for _, sent in itertools.islice(reversed(answered), counted))
        return (counted - 1) / max(answered[-1][0] - first_sent, 1e-3)

    def _answer_rate(self) -> float:
        """Answers per second over the last second (over the last few, where fewer came;
        since the first answer, where all came within the last second: at a run's start,
        8 answers in 50 ms are 140 a second, not 8).  What the store answers at in a burst
        too, and so above what it serves where an event loop took answers late (bunched):
        the pace a throttle sets starts here, and a cut of it is bounded by
        :meth:`_served_rate`."""
        answered = self._answered
        if len(answered) < 2:
            return 0.0
        now = self._clock()
        recent = self._recent(now)
        if recent >= 8:
            if recent < len(answered):  # answers from before the last second: a whole one
                return recent / 1.0
            return (recent - 1) / max(now - answered[-recent][0], 1e-3)
        span = answered[-1][0] - answered[max(0, len(answered) - 16)][0]
        return (min(len(answered), 16) - 1) / span if span > 0 else 0.0

    def _grow_pace(self) -> None:
        """One answer while paced: the pace grows (see the module's docstring); dropped
        once it has not limited for ``PACE_IDLE`` seconds."""
        near = PACE_NEAR * self._pace_refused
        if self.pace < near:  # back to below where the store last refused, in ~1 s
            step = max((near - self.pace) * 2.0 / max(self.pace, 1.0), PACE_GROWTH)
            self.pace = min(near, self.pace + step)
        else:  # past it: probe, faster the longer no refusal comes
            self.pace += self._pace_probe
            self._pace_probe *= 1.0 + 0.25 / max(self.pace, 1.0)
        now = self._clock()
        if self._answer_rate() * 2 < self.pace:
            if self._pace_slack_since is None:
                self._pace_slack_since = now
            elif now - self._pace_slack_since >= PACE_IDLE:
                self.pace = 0.0
                self._pace_slack_since = None
        else:
            self._pace_slack_since = None

    def _back_off(self) -> None:
        served, bounded = self._answer_rate(), self._served_rate()
        now = self._clock()
        # The most the store served at lately (halved every PACE_MEMORY seconds): the
        # pace never goes below PACE_FLOOR of it, so refusals that do not follow the rate
        # (faults, the store's own trouble) cannot spiral it down.  Served, not answered
        # in a burst: a floor above a strict limiter's rate would hold the pace there.
        decay = 0.5 ** ((now - self._best_at) / PACE_MEMORY)
        self._best_served, self._best_at = max(bounded, self._best_served * decay), now
        if self.pace > 0:  # where it refused: the pace now, if refused often enough...
            refused = self.pace if self._rate_refused() else 0.0  # 0: one early arrival
            if 0 < bounded < PACE_FLOOR * refused:  # ...or twice what it served, if less
                refused = bounded / PACE_FLOOR  # (a pace set from answers that came bunched)
            if refused > 0:
                self._pace_refused = refused
        else:  # unpaced: the rate it answered at, or a little below where it last refused
            refused = served
            if refused > 0:
                self._pace_refused = max(refused, PACE_FORGET * self._pace_refused)
        if refused > 0:
            self.pace = max(1.0, PACE_DECREASE * refused, PACE_FLOOR * self._best_served)
            self._pace_probe = PACE_GROWTH
            self._pace_slack_since = None
            self._judged.clear()  # the next cut is judged at the new pace
        self.generation += 1
        self._slow_start = False
        self._wmax = min(self.window, self.inflight)
        self._probe = PROBE
        self.window = max(float(self._floor()), self._decrease * min(self.window, self.inflight))

    def _size(self) -> None:
        self._since_sized = 0
        rate = self._rate() if self._rate is not None else None
        if rate is None or not self._holds:
            self.need = float(self.ceiling)
            return
        self.need = max(MIN_NEED, self._headroom * rate * (self._hold_sum / len(self._holds)))

    def _wake(self) -> None:
        while self._waiters and self.inflight < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.inflight += 1
                self._granted += 1
                fut.set_result(None)


async def _no_wait(_seconds: float) -> None:
    """A wait in a clock of the caller's own: its time passes as the caller says."""
