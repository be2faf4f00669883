"""What bounds a run (pure): the stage a run, or a stretch of one, waited on — the
verdict ``Stats.bound``, its summary and the trainer's scalars give, from one rule."""

from __future__ import annotations

from typing import Literal

__all__ = ["BOUNDS", "TELL_AFTER", "Bound", "verdict"]

Bound = Literal["fetch", "cache", "decode", "consumer", "unknown"]
BOUNDS: tuple[Bound, ...] = ("consumer", "decode", "fetch", "cache")
"""The stages a verdict can name (besides ``"unknown"``)."""

TELL_AFTER = 20
"""Batches delivered before ``Stats.bound`` names a stage: in a shorter run start-up weighs
as much as streaming."""


def verdict(
    *,
    batches: int,
    wait_fraction: float,
    decode_utilization: float,
    cache_hits: int,
    objects_fetched: int,
) -> Bound:
    """Which stage bounds a run (or a stretch of one) that delivered ``batches``, in which
    the consumer waited ``wait_fraction`` of the time and the decode workers were busy
    ``decode_utilization`` of it; ``cache_hits`` and ``objects_fetched`` tell the SSD cache
    from the store."""
    if batches < TELL_AFTER:
        return "unknown"  # start-up weighs as much as streaming
    if wait_fraction < 0.10:
        return "consumer"  # the consumer hardly ever waited: the loader is ahead of it
    if decode_utilization >= 0.80:
        return "decode"
    if cache_hits > objects_fetched:
        # Waiting with decode idle, most samples read from the SSD cache: its disk (or its
        # index), not the store, kept the decode workers waiting.
        return "cache"
    return "fetch"
