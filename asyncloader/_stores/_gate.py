"""How many requests go at once to a server that closes every connection, and to one through a
forward proxy.

A server that answers each request on a connection of its own and then closes it (HTTP/1.0,
``Connection: close``: Python's ``http.server``, old proxies and appliances) is often one
process serving its connections in turn, or threads under one lock (``http.server``'s
threads share a GIL): more requests at once then only queue there, and each one's share of
its time shrinks as the lock changes hands more often.  Against ``http.server`` on two
cores, 16 at once made 470 images/s and 4 to 6 at once 820-840
(``benchmarks/bench_servers.py``, RESULTS.md).  A server far away wants the opposite: its
answers take a round trip, and only more requests at once fill the wait.

:class:`ConnectionGate` tells them apart as TCP Vegas does: from the fastest answer seen
(the server's own time, with no queue), each round of answers (one per request the gate
lets through) estimates how many of those requests were queued at the server,
``limit × (1 − fastest / mean)``; fewer than ``QUEUED_LOW`` and the limit grows by one,
more than ``QUEUED_HIGH`` and it shrinks by one, between 1 and the ceiling.  A far server,
whose answers take about the round trip however many are in flight, keeps the ceiling; a
server that queues them is held where a few wait.  The fastest answer is the fastest seen
(a server that queues every request all the time answers none faster than its queue
allows, so a fastest of the last rounds alone would take the queue for the server's own
time and open more): a server that became slower for good is judged against how fast it
once was, and keeps fewer at once (about ``QUEUED_HIGH / (1 − old / new)``: 8 for answers
that now take twice as long).

Through a forward proxy, what limits the connections may be the proxy's own count of
clients (tinyproxy's ``MaxClients``: 100 in its sample configuration, 20 in openSUSE's):
past it, such a proxy leaves a new connection in its listen queue unanswered, and holds
its places for the connections it has; squid's ``maxconn`` rules answer it 403 instead
(``_lean_http`` tells that from a refused port).  :class:`ConnectionCap` keeps at most
``PROXY_CONNECTIONS`` requests, and so connections, to one origin through a proxy (as
browsers keep to one proxy), and where a new tunnel is not opened in time while others
work (or is refused so), cuts that to the connections working; it grows back by one every
``REGROW`` seconds of answers (the proxy's other clients may have left), and a cut follows
again where that one is not answered.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

__all__ = ["PROXY_CONNECTIONS", "ConnectionCap", "ConnectionGate"]

QUEUED_LOW = 2.0
QUEUED_HIGH = 4.0
PROXY_CONNECTIONS = 32
"""Requests (and so connections) at once to one origin through a forward proxy, at most."""
REGROW = 10.0
"""Seconds of answers after a cut (or a step back up) before a :class:`ConnectionCap` lets
one more connection try."""


class ConnectionGate:
    """An asyncio limit on requests at once to one server, adapted to its queue (see the
    module's docstring).

    Args:
        ceiling: The most at once.
        start: How many at once to begin with (default: ``ceiling``).
    """

    def __init__(self, ceiling: int, start: int | None = None) -> None:
        if ceiling < 1:
            raise ValueError("need ceiling >= 1")
        if start is not None and not 1 <= start <= ceiling:
            raise ValueError("need 1 <= start <= ceiling")
        self.ceiling = ceiling
        self.limit = ceiling if start is None else start
        self.inflight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._fastest = float("inf")  # the fastest answer seen [seconds]
        self._round: list[float] = []  # this round's answer times

    def __repr__(self) -> str:
        return f"ConnectionGate(limit={self.limit}, ceiling={self.ceiling})"

    async def acquire(self) -> None:
        """Wait for a place (first come, first served)."""
        if self.inflight < self.limit and not self._waiters:
            self.inflight += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # the place was handed over by release (inflight counts it)
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(None)  # handed a place as it was cancelled: pass it on
            elif fut in self._waiters:  # (a release may have passed it over already)
                self._waiters.remove(fut)
            raise

    def release(self, seconds: float | None) -> None:
        """Give a place back; ``seconds``: how long the request took (None: it failed,
        and says nothing about the server's queue)."""
        self.inflight -= 1
        if seconds is not None:
            self._learn(seconds)
        self._hand_over()

    def _hand_over(self) -> None:
        """Places free under the limit go to the requests waiting, first come first."""
        while self._waiters and self.inflight < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.inflight += 1
                fut.set_result(None)

    def hold_below(self, at_once: int) -> None:
        """A connection opened with ``at_once`` requests in flight (its own included) took
        a second where others take milliseconds: its handshake was dropped from the
        server's full listen queue and sent again.  Never that many at once again."""
        self.ceiling = max(1, min(self.ceiling, at_once - 1))
        self.limit = min(self.limit, self.ceiling)

    def lift(self) -> None:
        """No limit from now on: every request waiting goes (a gate put in place before the
        server was known, which turned out to keep its connections alive)."""
        self.limit = self.ceiling = 1 << 30
        self._hand_over()

    def _learn(self, seconds: float) -> None:
        self._round.append(seconds)
        self._fastest = min(self._fastest, seconds)
        if len(self._round) < self.limit:
            return
        mean = sum(self._round) / len(self._round)
        queued = self.limit * (1.0 - self._fastest / mean) if mean > 0 else 0.0
        if queued < QUEUED_LOW:
            self.limit = min(self.ceiling, self.limit + 1)
        elif queued > QUEUED_HIGH:
            self.limit = max(1, self.limit - 1)
        self._round.clear()


class ConnectionCap(ConnectionGate):
    """A :class:`ConnectionGate` for connections through a forward proxy (see the module's
    docstring): not adapted to answer times (a proxy's clients, not its queue, are what it
    counts), but :meth:`cut` where the proxy leaves a new connection unanswered, and grown
    back by one every ``regrow`` seconds of answers, up to ``ceiling``."""

    def __init__(self, ceiling: int = PROXY_CONNECTIONS, regrow: float = REGROW) -> None:
        super().__init__(ceiling)
        self.regrow = regrow
        self._changed = time.monotonic()

    def __repr__(self) -> str:
        return f"ConnectionCap(limit={self.limit}, ceiling={self.ceiling})"

    def cut(self, working: int) -> None:
        """A new connection went unanswered while ``working`` others work: at most that
        many at once (none working says nothing of a limit: the proxy is away, or slow)."""
        if working >= 1:
            self.limit = min(self.limit, working)
            self._changed = time.monotonic()

    def _learn(self, seconds: float) -> None:
        now = time.monotonic()
        if self.limit < self.ceiling and now - self._changed >= self.regrow:
            self.limit += 1
            self._changed = now
