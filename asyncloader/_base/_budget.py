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
  store refuses.  Below that, requests are paced right and one now and then arrives a
  little early (a strict limiter counts whole milliseconds between arrivals, and the
  client's and the server's scheduling move each arrival by about as much): such a refusal
  is retried as any other, stops the pace's probe from speeding up, and leaves the pace
  where it is (the window backs off).  A pace cut at every refusal was held well below a
  strict limiter's rate by such arrivals (``benchmarks/bench_servers.py``, RESULTS.md).
  A paced request waits for its turn on a :class:`~._timer.PreciseTimer` (asyncio's timers
  end up to a millisecond late, 7 % of a turn at 140 a second), and goes no sooner than
  ``PACE_GAP`` of a turn after the request before it.
  A pace that stays twice what is sent for ``PACE_IDLE`` seconds (it is not what limits)
  is dropped.  The pace never goes below ``PACE_FLOOR`` of the most the store answered at
  lately (that most halving every ``PACE_MEMORY`` seconds): refusals that do not follow
  the rate (faults, the store's own trouble) cannot spiral it down.

**One budget per node** (:class:`NodeShare`): the loaders of one node that read one store
into one cache folder — its ranks and their DataLoader workers — are, to the store, one
client.  Each backing off alone, N of them recover N times as fast as one and the store
keeps throttling.  Sharing a small file in the cache folder, a back-off of any of them is a
back-off of all (once per round of requests, node-wide), and each grows its window by
``1 / active`` of the step and goes down to ``1 / active`` of the floor, so that together
they climb, and back off, as one client does.

Asyncio, the standard library and its timer (``_timer``) only.  The budget runs on one event
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import mmap
import os
import random
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ._timer import precise_sleep

__all__ = ["MIN_NEED", "InflightBudget", "NodeShare", "Permit"]

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


_MAGIC = b"ALNODE01"
_HEAD = struct.Struct("<8sqd")  # magic, back-offs so far, when the last one was
_SLOT = struct.Struct("<qd")  # a member's token (0: free), its last heartbeat
_SLOTS = 128
_SIZE = _HEAD.size + _SLOTS * _SLOT.size


class NodeShare:
    """What the loaders of one node reading one store share: the node's back-offs, and how
    many of them are active.  A small file (``path``, in the cache folder), mapped in
    memory and changed under an advisory lock; a member that has not been heard of for
    ``stale`` seconds (stopped, killed) no longer counts and its slot is taken again.

    Args:
        path: The file (made, with its folder, if missing).
        stale: Seconds without a heartbeat after which a member is gone.
        clock: Wall-clock seconds (shared by processes: not monotonic).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stale: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self._stale = stale
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with self._lock(fd):
                if os.fstat(fd).st_size < _SIZE:
                    # Written, not truncated to size: a sparse file's page would need its
                    # block when first written through the map, and on a full disk that
                    # is SIGBUS, not an error.
                    os.pwrite(fd, bytes(_SIZE), 0)
                self._map = mmap.mmap(fd, _SIZE)
                if self._map[: len(_MAGIC)] != _MAGIC:  # new (or another version's): reset
                    self._map[:] = bytes(_SIZE)
                    _HEAD.pack_into(self._map, 0, _MAGIC, 0, 0.0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._token = random.getrandbits(62) | 1
        self._slot = -1
        self.generation = 0  # the node's back-offs when this member last looked
        self.generation, _ = self.poll()  # joined: only later back-offs apply to it

    def __repr__(self) -> str:
        return f"NodeShare({str(self.path)!r})"

    @contextlib.contextmanager
    def _lock(self, fd: int | None = None) -> Iterator[None]:
        fd = self._fd if fd is None else fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _beat(self, now: float) -> None:
        """Refresh this member's heartbeat, taking a slot again if it lost its own (held
        a long time without a word, and given to another).  Under the lock."""
        m = self._map
        if self._slot >= 0 and _SLOT.unpack_from(m, _HEAD.size + self._slot * _SLOT.size)[0] == (
            self._token
        ):
            _SLOT.pack_into(m, _HEAD.size + self._slot * _SLOT.size, self._token, now)
            return
        self._slot = -1
        for i in range(_SLOTS):
            token, beat = _SLOT.unpack_from(m, _HEAD.size + i * _SLOT.size)
            if token == 0 or beat < now - self._stale:
                _SLOT.pack_into(m, _HEAD.size + i * _SLOT.size, self._token, now)
                self._slot = i
                return
        # Every slot taken: this member goes uncounted (the node is larger than the table).

    def poll(self) -> tuple[int, int]:
        """A heartbeat; the node's back-offs so far and its active members (this one
        included)."""
        now = self._clock()
        with self._lock():
            self._beat(now)
            _, generation, _ = _HEAD.unpack_from(self._map, 0)
            active = sum(
                1
                for i in range(_SLOTS)
                if (slot := _SLOT.unpack_from(self._map, _HEAD.size + i * _SLOT.size))[0]
                and slot[1] >= now - self._stale
            )
        return generation, max(1, active + (self._slot < 0))

    def back_off(self, gap: float) -> int:
        """A member was throttled: the node backs off, unless it did less than ``gap``
        seconds ago (one round of requests: the same congestion).  Returns the node's
        back-offs so far."""
        now = self._clock()
        with self._lock():
            magic, generation, last = _HEAD.unpack_from(self._map, 0)
            if now - last >= gap or now < last:
                generation += 1
                _HEAD.pack_into(self._map, 0, magic, generation, now)
        return int(generation)

    def close(self) -> None:
        """Leave the node (the slot is freed).  Idempotent."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError, ValueError):
            with self._lock():
                at = _HEAD.size + self._slot * _SLOT.size
                if self._slot >= 0 and _SLOT.unpack_from(self._map, at)[0] == self._token:
                    _SLOT.pack_into(self._map, at, 0, 0.0)
            self._map.close()
        os.close(self._fd)
        self._fd = -1


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
        self._answered: deque[float] = deque(maxlen=4096)  # when the last answers came
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
            self._answered.append(self._clock())
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

    def _answer_rate(self) -> float:
        """Answers per second over the last second (over the last few, where fewer came;
        since the first answer, where all came within the last second: at a run's start,
        8 answers in 50 ms are 140 a second, not 8)."""
        answered = self._answered
        if len(answered) < 2:
            return 0.0
        now = self._clock()
        recent = [t for t in answered if now - t <= 1.0]
        if len(recent) >= 8:
            if len(recent) < len(answered):  # answers from before the last second: a whole one
                return len(recent) / 1.0
            return (len(recent) - 1) / max(now - recent[0], 1e-3)
        span = answered[-1] - answered[max(0, len(answered) - 16)]
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
        served = self._answer_rate()
        now = self._clock()
        # The most the store answered at lately (halved every PACE_MEMORY seconds): the
        # pace never goes below PACE_FLOOR of it, so refusals that do not follow the rate
        # (faults, the store's own trouble) cannot spiral it down.
        decay = 0.5 ** ((now - self._best_at) / PACE_MEMORY)
        self._best_served, self._best_at = max(served, self._best_served * decay), now
        if self.pace > 0:  # where it refused: the pace now, if refused often enough
            refused = self.pace if self._rate_refused() else 0.0  # 0: one early arrival
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
