"""The loader's health as flat scalars, for the plots a trainer already keeps.

A :class:`Point` is what a loader had counted at one moment (its totals since it started,
and its gauges now), taken from a :class:`~asyncloader.Stats`; :func:`scalars` turns two
points into the figures of the stretch between them (since the last log, since the epoch
began), named as :data:`SCALARS` says.  Points of several loaders (a rank's DataLoader
workers) combine into one (:meth:`Point.combined`), and a point travels as a flat vector
(:meth:`Point.vector`), which is how DataLoader workers hand theirs to the training process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ._bound import BOUNDS, verdict
from ._stats import Stats

__all__ = ["SCALARS", "Point", "Waits", "scalars"]

TOTALS = (
    "samples",
    "batches",
    "wait_seconds",
    "decode_seconds",
    "decoded",
    "requests",
    "bytes_fetched",
    "objects_fetched",
    "fetch_seconds",
    "cache_hits",
    "cache_misses",
    "retries",
    "throttled",
    "backoffs",
    "skipped",
    "hedges_sent",
    "hedges_won",
    "engine_restarts",
)
"""Counts and times since a loader started: a stretch's figure is the difference."""
SUMMED = ("decode_workers", "inflight", "inflight_limit", "ring_full", "ring_held", "ring_slots")
"""Gauges (what holds now) that add up over several loaders."""
HIGHEST = ("request_p50", "request_p90", "request_p99")
"""Gauges that combine as the highest of several loaders' (recent latency quantiles)."""
FIELDS = TOTALS + SUMMED + HIGHEST

SCALARS: dict[str, str] = {
    "interval_seconds": "the stretch the figures cover [s]",
    "samples": "samples delivered to the training loop",
    "batches": "batches delivered to the training loop",
    "samples_per_second": "samples delivered per second of the stretch",
    "wait_seconds": "time the training loop waited for batches [s]",
    "wait_fraction": "wait_seconds / interval_seconds (0: never waited, 1: always)",
    "wait_ms_per_batch": "the mean wait for one batch [ms]",
    "decode_workers": "decode workers (threads or engine processes), all loaders together",
    "decode_utilization": "their busy fraction in the stretch (0..1)",
    "decode_ms_per_sample": "decode workers' busy time per sample decoded [ms]",
    "requests": "HTTP requests sent (retries included)",
    "megabytes_fetched": "body bytes received from the store [MB]",
    "megabytes_per_second": "megabytes_fetched per second of the stretch",
    "fetch_ms_mean": "the mean time of one object fetch, retries included [ms]",
    "request_p50_ms": "median latency of recent requests [ms]",
    "request_p90_ms": "90th percentile latency of recent requests [ms]",
    "request_p99_ms": "99th percentile latency of recent requests [ms]",
    "inflight": "requests in flight now",
    "inflight_limit": "the adaptive budget's limit of requests in flight now",
    "retries": "requests retried, for any reason",
    "throttled": "of retries, those for throttled answers (503 SlowDown, 429)",
    "backoffs": "times the budget backed off on a throttled answer",
    "hedges_sent": "second requests sent for answers later than the learned deadline",
    "hedges_won": "hedges whose answer came first",
    "cache_hits": "samples read from the SSD cache",
    "cache_misses": "samples not found in the SSD cache (fetched)",
    "cache_hit_rate": "cache_hits / (cache_hits + cache_misses); 0 with no cache",
    "skipped": "samples left out under on_error='skip'",
    "engine_restarts": "engine processes that died and were replaced",
    "ring_full": "batch slots made and waiting for the training loop, now",
    "ring_held": "batch slots whose batch the training loop still holds, now",
    "ring_slots": "batch slots, all loaders together",
    "bound_consumer": "1 when the training loop was the bound in the stretch (else 0)",
    "bound_decode": "1 when decoding was the bound (decode workers busy 80 % or more)",
    "bound_fetch": "1 when the store was the bound (waiting while decode workers idled)",
    "bound_cache": "1 when the SSD cache's disk was the bound (the same, from the cache)",
}
"""Every scalar's name and meaning; the names are stable (a trainer's plots key on them).
Counts and times are those of the stretch; "now" marks a gauge, as it stands at its end.
The bound_* figures are all 0 in a stretch of fewer than 20 batches (too short to tell)."""


@dataclass(frozen=True, slots=True)
class Waits:
    """The training loop's own view of a stretch, measured where it iterates (what a
    DataLoader's workers cannot see): batches and samples received, seconds waited."""

    batches: int = 0
    samples: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Point:
    """What a loader had counted at one moment.

    Attributes:
        at: ``time.monotonic()`` when it was taken (one clock for every process of a
            machine) [s].
        wall: Time since the loader started [s].
        values: The figures of :data:`FIELDS`, in that order.
    """

    at: float
    wall: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, stats: Stats) -> Point:
        """The point of ``stats`` (taken now)."""
        s = stats
        figures = {
            "samples": s.samples,
            "batches": s.batches,
            "wait_seconds": s.consumer_wait_seconds,
            "decode_seconds": s.decode_seconds,
            "decoded": s.decoded,
            "requests": s.requests,
            "bytes_fetched": s.bytes_fetched,
            "objects_fetched": s.objects_fetched,
            "fetch_seconds": s.mean_fetch_seconds * s.objects_fetched,
            "cache_hits": s.cache_hits,
            "cache_misses": s.cache_misses,
            "retries": sum(s.retries.values()),
            "throttled": s.retries.get("throttled", 0),
            "backoffs": s.backoffs,
            "skipped": sum(s.skipped.values()),
            "hedges_sent": s.hedges_sent,
            "hedges_won": s.hedges_won,
            "engine_restarts": s.engine_restarts,
            "decode_workers": s.decode_workers,
            "inflight": s.inflight,
            "inflight_limit": s.inflight_limit,
            "ring_full": s.ring_full,
            "ring_held": s.ring_held,
            "ring_slots": s.ring_slots,
            "request_p50": s.request_p50,
            "request_p90": s.request_p90,
            "request_p99": s.request_p99,
        }
        return cls(time.monotonic(), s.wall_seconds, tuple(float(figures[f]) for f in FIELDS))

    def get(self, name: str) -> float:
        return self.values[FIELDS.index(name)]

    def vector(self) -> list[float]:
        """``[at, wall, *values]``: the point as a row of floats."""
        return [self.at, self.wall, *self.values]

    @classmethod
    def from_vector(cls, row: Sequence[float]) -> Point:
        if len(row) != 2 + len(FIELDS):
            raise ValueError(f"a point has {2 + len(FIELDS)} figures, not {len(row)}")
        return cls(float(row[0]), float(row[1]), tuple(float(v) for v in row[2:]))

    @classmethod
    def combined(cls, points: Sequence[Point]) -> Point:
        """Several loaders' points as one loader's: totals and the summed gauges added, the
        latency quantiles the highest; taken at the latest moment, the longest-lived's wall."""
        if not points:
            return cls(time.monotonic(), 0.0, (0.0,) * len(FIELDS))
        values = []
        for i, name in enumerate(FIELDS):
            column = [p.values[i] for p in points]
            values.append(max(column) if name in HIGHEST else sum(column))
        return cls(max(p.at for p in points), max(p.wall for p in points), tuple(values))

    def after(self, before: Point) -> Point:
        """This point of a loader that took over from one whose last point was ``before``
        (a DataLoader worker of a later epoch): its totals go on from that one's."""
        values = tuple(
            v + b if name in TOTALS else v
            for name, v, b in zip(FIELDS, self.values, before.values, strict=True)
        )
        return Point(self.at, self.wall, values)


def scalars(
    later: Point,
    earlier: Point | None = None,
    waits: Waits | None = None,
    span: float | None = None,
) -> dict[str, float]:
    """The figures of :data:`SCALARS` for the stretch from ``earlier`` (None: the loader's
    start) to ``later``; ``waits``, where given, are the training loop's own batches,
    samples and wait in it, in place of the loader's, and ``span`` its length by the
    training loop's clock [s] (the points may be a little older than their reading)."""
    if span is None:
        span = later.at - earlier.at if earlier is not None else later.wall
    span = max(span, 1e-9)
    d = {
        name: later.values[i] - (earlier.values[i] if earlier is not None else 0.0)
        for i, name in enumerate(TOTALS)
    }
    if waits is not None:
        d.update(batches=waits.batches, samples=waits.samples, wait_seconds=waits.seconds)
    now = {name: later.get(name) for name in SUMMED + HIGHEST}
    workers = max(now["decode_workers"], 1.0)
    utilization = d["decode_seconds"] / (span * workers)
    cached = d["cache_hits"] + d["cache_misses"]
    bound = verdict(
        batches=int(d["batches"]),
        wait_fraction=d["wait_seconds"] / span,
        decode_utilization=utilization,
        cache_hits=int(d["cache_hits"]),
        objects_fetched=int(d["objects_fetched"]),
    )
    out = {
        "interval_seconds": span,
        "samples": d["samples"],
        "batches": d["batches"],
        "samples_per_second": d["samples"] / span,
        "wait_seconds": d["wait_seconds"],
        "wait_fraction": min(d["wait_seconds"] / span, 1.0),
        "wait_ms_per_batch": 1e3 * d["wait_seconds"] / max(d["batches"], 1.0),
        "decode_workers": now["decode_workers"],
        "decode_utilization": utilization,
        "decode_ms_per_sample": 1e3 * d["decode_seconds"] / max(d["decoded"], 1.0),
        "requests": d["requests"],
        "megabytes_fetched": d["bytes_fetched"] / 1e6,
        "megabytes_per_second": d["bytes_fetched"] / 1e6 / span,
        "fetch_ms_mean": 1e3 * d["fetch_seconds"] / max(d["objects_fetched"], 1.0),
        "request_p50_ms": 1e3 * now["request_p50"],
        "request_p90_ms": 1e3 * now["request_p90"],
        "request_p99_ms": 1e3 * now["request_p99"],
        "inflight": now["inflight"],
        "inflight_limit": now["inflight_limit"],
        "retries": d["retries"],
        "throttled": d["throttled"],
        "backoffs": d["backoffs"],
        "hedges_sent": d["hedges_sent"],
        "hedges_won": d["hedges_won"],
        "cache_hits": d["cache_hits"],
        "cache_misses": d["cache_misses"],
        "cache_hit_rate": d["cache_hits"] / cached if cached else 0.0,
        "skipped": d["skipped"],
        "engine_restarts": d["engine_restarts"],
        "ring_full": now["ring_full"],
        "ring_held": now["ring_held"],
        "ring_slots": now["ring_slots"],
    }
    out.update({f"bound_{stage}": float(bound == stage) for stage in BOUNDS})
    return {name: float(out[name]) for name in SCALARS}
