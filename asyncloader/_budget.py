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

A leaf module: asyncio and the standard library only.  Runs on one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MIN_NEED", "InflightBudget", "Permit"]

MIN_NEED = 16
PROBE = 0.1


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
        self.window = float(min(ceiling, max(start or ceiling, self.floor)))  # AIMD
        self._slow_start = True  # until the first back-off
        self._wmax = 0.0  # the window when the store last throttled
        self._probe = PROBE  # the window's growth per window of answers past _wmax
        self.need = float(ceiling)  # Little's law: what the consumer can use
        self.inflight = 0
        self.generation = 0  # back-offs so far
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._holds: deque[float] = deque(maxlen=samples)
        self._hold_sum = 0.0
        self._since_sized = 0

    @property
    def limit(self) -> int:
        """Requests that may be in flight now."""
        return max(self.floor, min(self.ceiling, int(min(self.window, self.need))))

    async def acquire(self) -> Permit:
        """Wait for a slot (first come, first served)."""
        if self.inflight >= self.limit or self._waiters:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self.inflight -= 1  # granted as it was cancelled: give the slot back
                    self._wake()
                else:
                    self._waiters.remove(fut)
                raise
        else:
            self.inflight += 1
        return Permit(self._clock(), self.generation)

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
                step = 1.0 / self.window
            else:  # past where the store last throttled: probe slowly, then faster
                step = self._probe / self.window
                self._probe = min(1.0, self._probe * (1.0 + 0.25 / self.window))
            self.window = min(float(self.ceiling), self.window + step)
        self._since_sized += 1
        if self._since_sized >= 16:
            self._size()
        self._wake()

    def throttled(self, generation: int) -> bool:
        """A request sent in ``generation`` was throttled: back off, once per generation.
        Returns whether this backed off."""
        if generation != self.generation or self.floor == self.ceiling:
            return False  # sent before the last back-off (that one answered for it), or fixed
        self.generation += 1
        self._slow_start = False
        self._wmax = min(self.window, self.inflight)
        self._probe = PROBE
        self.window = max(float(self.floor), self._decrease * min(self.window, self.inflight))
        return True

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
                fut.set_result(None)
