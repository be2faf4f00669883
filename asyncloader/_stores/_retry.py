"""The one retry loop: throttling and transient errors retried with full-jitter backoff.

Object GETs (the fetcher) and a store's own control requests (listing pages, HEADs) use it
alike; only their budgets differ (:class:`~asyncloader.FetchConfig`).  A leaf module.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .._base._budget import InflightBudget
from .._base._config import FetchConfig
from .._base._errors import LengthMismatch, StoreError, Throttled, TransientStoreError
from .._base._stats import Counters

__all__ = [
    "CONTROL_RETRIES",
    "RETRIED",
    "counted_retrying",
    "in_slot",
    "retry_reason",
    "retrying",
]

RETRIED = (Throttled, TransientStoreError, LengthMismatch)
"""What is retried: throttling, transient failures, and answers cut short."""

T = TypeVar("T")


def retry_reason(exc: StoreError) -> str:
    """How ``stats().retries`` names a retried error: ``throttled``, ``short`` (an answer
    cut short) or ``transient``."""
    if isinstance(exc, Throttled):
        return "throttled"
    if isinstance(exc, LengthMismatch):
        return "short"
    return "transient"


async def in_slot(budget: InflightBudget, call: Callable[[], Awaitable[T]]) -> T:
    """One try of ``call()`` holding a slot of ``budget``: a throttled answer backs the
    budget off (and, from then on, paces it); the slot goes back however the try ends,
    as answered only where it returned."""
    permit = await budget.acquire()
    answered = False
    try:
        out = await call()
        answered = True
        return out
    except Throttled:
        budget.throttled(permit.generation)
        raise
    finally:
        budget.release(permit, answered=answered)


CONTROL_RETRIES = FetchConfig(max_attempts=6)
"""The budget of a store's control requests (listing pages, HEADs)."""


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    config: FetchConfig = CONTROL_RETRIES,
    *,
    on_retry: Callable[[StoreError], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """Await ``attempt()`` until it succeeds; retry :class:`Throttled`,
    :class:`TransientStoreError` and :class:`LengthMismatch` up to ``config.max_attempts``
    tries in all.

    Between tries it sleeps a uniform delay below ``config.backoff(n)`` (exponential backoff
    with full jitter), outside whatever ``attempt`` holds (an in-flight slot is released
    while waiting); at least what a throttled answer asked for (``Retry-After``), up to
    ``config.backoff_cap``.  ``on_retry`` is told of each error that is retried.

    Raises:
        The last error, with a note saying how many attempts were made, once they ran out;
        any other error at once.
    """
    draw = (rng or random).random
    tries = 0
    while True:
        try:
            return await attempt()
        except RETRIED as exc:
            tries += 1
            if tries >= config.max_attempts:
                exc.add_note(f"gave up after {tries} attempts")
                raise
            if on_retry is not None:
                on_retry(exc)
            delay = config.backoff(tries) * draw()
            asked = exc.retry_after if isinstance(exc, Throttled) else None
            if asked is not None:
                delay = max(delay, min(asked, config.backoff_cap))
            await asyncio.sleep(delay)


async def counted_retrying(attempt: Callable[[], Awaitable[T]], counters: Counters | None) -> T:
    """:func:`retrying` for a read outside the fetcher (an image's header, a metadata
    file), counted as the fetcher counts its own: each try a request sent
    (``stats().requests``), each retry by its reason (``stats().retries``)."""

    async def counted() -> T:
        if counters is not None:
            counters.requests += 1
        return await attempt()

    def retried(exc: StoreError) -> None:
        if counters is not None:
            counters.retries[retry_reason(exc)] += 1

    return await retrying(counted, on_retry=retried)
