"""Counters of the data path (the frozen snapshot ``loader.stats()`` returns is
:mod:`._snapshot`'s :class:`Stats`).

Writers: the event-loop thread owns every counter in :class:`Counters` except the
``consumer_*`` ones, which only the consumer thread writes.  Each field therefore has a
single writer and readers only ever see a slightly stale value, which is fine for stats.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from ._bound import BOUNDS, TELL_AFTER, Bound, verdict
from ._latency import LatencyWindow
from ._snapshot import Stats
from ._types import CacheEvent, DecodePath, Outcome

__all__ = ["BOUNDS", "TELL_AFTER", "Bound", "Counters", "LatencyWindow", "Stats", "verdict"]

log = logging.getLogger("asyncloader")

SKIPPED_KEYS = 100
"""Keys of skipped samples that ``stats().skipped_keys`` names (all are counted)."""
SKIPPED_LOGGED = 10
"""Skipped samples logged one by one (a warning each); then one line says more follow."""

# Counters the lead engine process alone keeps (merged: its value).
_FIRST = frozenset(
    {
        "listing_seconds",
        "objects_listed",
        "unnamed_images",
        "filtered_out",
        "cache_share",
        "node_loaders",
        "consumer_first_batch_seconds",
        "gpu_engines",
    }
)
# What a counter holds now rather than what it counted: a replaced engine's is gone with it.
_GAUGES = ("inflight", "inflight_limit", "decode_queue", "ring_out", "ring_slots")


@dataclass(slots=True)
class Counters:
    """Mutable counters; see the module docstring for who writes what."""

    started: float = field(default_factory=time.perf_counter)
    requests: int = 0
    bytes_fetched: int = 0
    retries: Counter[str] = field(default_factory=Counter)
    objects_fetched: int = 0
    fetch_seconds: float = 0.0  # summed wall time of object fetches [seconds]
    inflight: int = 0
    inflight_peak: int = 0
    hedges_sent: int = 0  # second requests for answers later than the learned deadline
    hedges_won: int = 0  # hedges whose answer came first
    inflight_limit: int = 0  # the adaptive budget's limit now (0: not fetched yet)
    backoffs: int = 0  # times the budget backed off on a throttled answer
    backoffs_followed: int = 0  # back-offs for another loader of the node's throttled answer
    node_loaders: int = 0  # loaders sharing the node's budget (0: not shared)
    latency: LatencyWindow = field(default_factory=LatencyWindow)  # of answered requests
    decoded: int = 0
    decode_seconds: float = 0.0  # summed busy time of decode workers [seconds]
    gpu_decoded: int = 0  # DecodeConfig(backend="cuda"): samples the GPU decoded
    gpu_to_cpu: int = 0  # ... the CPU decoded: not given to the GPU, or refused by it
    gpu_suspect: int = 0  # ... the GPU's image failed the check: decoded on the CPU
    gpu_shipped: int = 0  # ... the JPEG shipped by an engine process to the trainer's GPU
    gpu_hardware: int = 0  # ... of gpu_decoded, those nvJPEG's hardware decoder took
    gpu_engines: int | None = None  # ... the hardware decoder's engines (None: not known)
    decode_queue: int = 0  # jobs handed to the pool and not yet finished
    engine_restarts: int = 0  # engine processes that died and were replaced (the trainer's)
    batches_produced: int = 0
    ring_out: int = 0  # slots published: waiting for the consumer, or held by its batches
    ring_slots: int = 0
    listing_seconds: float = 0.0
    objects_listed: int = 0
    unnamed_images: int = 0  # left out: images no metadata file names
    filtered_out: int = 0  # left out by filters=, never requested
    cache_hits: int = 0
    cache_scaled_hits: int = 0
    cache_misses: int = 0
    bytes_from_cache: int = 0
    cache_stored: int = 0
    cache_store_failed: int = 0
    cache_store_skipped: int = 0
    cache_share: float = 1.0
    cache_damaged: int = 0
    sidecars_cached: int = 0  # sidecar files (extras=) read from the cache or in hand
    sidecars_fetched: int = 0  # sidecar files fetched from the store
    # Written by the consumer thread only.
    consumer_batches: int = 0
    consumer_samples: int = 0
    consumer_wait_seconds: float = 0.0
    consumer_first_batch_seconds: float | None = None
    skipped: Counter[str] = field(default_factory=Counter)  # in batches delivered
    skipped_keys: list[str] = field(default_factory=list)  # the first SKIPPED_KEYS of them
    by_source: Counter[str] = field(default_factory=Counter)  # samples delivered, by source

    def count_skipped(self, by_type: Counter[str], keys: Sequence[str]) -> None:
        """Samples left out of a batch delivered (``on_error="skip"``): counted, the first
        ``SKIPPED_KEYS`` named, and the first ``SKIPPED_LOGGED`` logged as a warning."""
        before = sum(self.skipped.values())
        self.skipped.update(by_type)
        room = SKIPPED_KEYS - len(self.skipped_keys)
        self.skipped_keys += list(keys[: max(room, 0)])
        for i, key in enumerate(keys, before):
            if i < SKIPPED_LOGGED:
                log.warning("asyncloader: skipped %s (on_error='skip'; stats().skipped_keys)", key)
            elif i == SKIPPED_LOGGED:
                log.warning("asyncloader: more samples skipped: stats().skipped counts them all")

    def count_path(self, path: DecodePath) -> None:
        """Account where one sample was decoded (GPU decode's paths; the CPU's is not
        counted)."""
        if path is DecodePath.GPU:
            self.gpu_decoded += 1
        elif path is DecodePath.GPU_HARDWARE:
            self.gpu_decoded += 1
            self.gpu_hardware += 1
        elif path is DecodePath.GPU_TO_CPU:
            self.gpu_to_cpu += 1
        elif path is DecodePath.GPU_SUSPECT:
            self.gpu_suspect += 1
        elif path is DecodePath.SHIPPED:
            self.gpu_shipped += 1

    def count_decode(self, outcome: Outcome, *, size: int = 0, caching: bool = False) -> None:
        """Account one decode job: the worker's busy time and its cache events.

        Args:
            outcome: What the job reported.
            size: The object's size, counted as read from the cache on a hit [bytes].
            caching: A cache is on: a sample decoded from fetched bytes was a miss.
        """
        events = outcome.events
        self.decode_seconds += outcome.busy
        self.count_path(outcome.path)
        if events & CacheEvent.MISS:
            self.cache_misses += 1
        else:
            self.decoded += 1
            if events & CacheEvent.HIT:
                self.cache_hits += 1
                self.cache_scaled_hits += bool(events & CacheEvent.SCALED)
                self.bytes_from_cache += max(size, 0)
            elif caching:
                self.cache_misses += 1
        if events & CacheEvent.DAMAGED:
            self.cache_damaged += 1

    @classmethod
    def merged(cls, parts: list[Counters]) -> Counters:
        """The counters of several engine processes as one loader's: counts and times
        summed, latency windows pooled; the listing's and the cache share's as the first
        (the lead engine's) says."""
        out = cls()
        if not parts:
            return out
        for f in fields(cls):
            name = f.name
            values = [getattr(part, name) for part in parts]
            if name in _FIRST:
                setattr(out, name, values[0])
            elif name == "started":
                out.started = min(values)
            elif name == "latency":
                out.latency = LatencyWindow.pooled(values)
            elif isinstance(values[0], Counter):
                setattr(out, name, sum(values, Counter()))
            elif isinstance(values[0], int | float):
                setattr(out, name, sum(values))
        return out

    def of_the_dead(self) -> Counters:
        """A copy of what an engine process that died had counted, without what it held
        then (requests in flight, slots, the queue): merged with the living engines'
        counters, it keeps the run's totals."""
        out = copy.deepcopy(self)
        for name in _GAUGES:
            setattr(out, name, 0)
        return out

    def with_consumer(self, consumer: Counters) -> Counters:
        """These counters with the ``consumer_*`` fields and skips of ``consumer`` (the
        loader's, when the engine counts elsewhere); ``self`` when they are the same."""
        if consumer is self:
            return self
        out = copy.copy(self)
        out.consumer_batches = consumer.consumer_batches
        out.consumer_samples = consumer.consumer_samples
        out.consumer_wait_seconds = consumer.consumer_wait_seconds
        out.consumer_first_batch_seconds = consumer.consumer_first_batch_seconds
        out.skipped = consumer.skipped
        out.skipped_keys = consumer.skipped_keys
        out.by_source = consumer.by_source
        out.started = consumer.started
        # GPU decode with engine processes: the GPU's work is the training process's.
        out.gpu_decoded += consumer.gpu_decoded
        out.gpu_to_cpu += consumer.gpu_to_cpu
        out.gpu_suspect += consumer.gpu_suspect
        out.gpu_hardware += consumer.gpu_hardware
        if consumer.gpu_engines is not None:
            out.gpu_engines = consumer.gpu_engines
        return out

    def snapshot(
        self, *, decode_workers: int, max_inflight: int, ring_held: int = 0, cpu_budget: str = ""
    ) -> Stats:
        """The frozen view; ``ring_held`` comes from the ring (any thread may change it)."""
        wall = max(time.perf_counter() - self.started, 1e-9)
        decode_util = self.decode_seconds / (wall * max(decode_workers, 1))
        bound = verdict(
            batches=self.consumer_batches,
            wait_fraction=self.consumer_wait_seconds / wall,
            decode_utilization=decode_util,
            cache_hits=self.cache_hits,
            objects_fetched=self.objects_fetched,
        )
        return Stats(
            wall_seconds=wall,
            requests=self.requests,
            bytes_fetched=self.bytes_fetched,
            retries=dict(self.retries),
            objects_fetched=self.objects_fetched,
            mean_fetch_seconds=self.fetch_seconds / max(self.objects_fetched, 1),
            inflight=self.inflight,
            inflight_peak=self.inflight_peak,
            max_inflight=max_inflight,
            inflight_limit=self.inflight_limit or max_inflight,
            backoffs=self.backoffs + self.backoffs_followed,
            backoffs_followed=self.backoffs_followed,
            node_loaders=self.node_loaders,
            hedges_sent=self.hedges_sent,
            hedges_won=self.hedges_won,
            request_p50=self.latency.quantile(0.50),
            request_p90=self.latency.quantile(0.90),
            request_p99=self.latency.quantile(0.99),
            decoded=self.decoded,
            decode_utilization=decode_util,
            decode_seconds=self.decode_seconds,
            gpu_decoded=self.gpu_decoded,
            gpu_to_cpu=self.gpu_to_cpu,
            gpu_suspect=self.gpu_suspect,
            gpu_shipped=self.gpu_shipped,
            gpu_hardware=self.gpu_hardware,
            gpu_engines=self.gpu_engines,
            decode_queue=self.decode_queue,
            engine_restarts=self.engine_restarts,
            skipped=dict(self.skipped),
            skipped_keys=tuple(self.skipped_keys),
            samples_by_source=dict(self.by_source),
            batches_produced=self.batches_produced,
            ring_full=max(self.ring_out - ring_held, 0),
            ring_held=ring_held,
            ring_slots=self.ring_slots,
            objects_listed=self.objects_listed,
            unnamed_images=self.unnamed_images,
            filtered_out=self.filtered_out,
            listing_seconds=self.listing_seconds,
            cache_hits=self.cache_hits,
            cache_scaled_hits=self.cache_scaled_hits,
            cache_misses=self.cache_misses,
            bytes_from_cache=self.bytes_from_cache,
            cache_stored=self.cache_stored,
            cache_store_failed=self.cache_store_failed,
            cache_store_skipped=self.cache_store_skipped,
            cache_share=self.cache_share,
            cache_damaged=self.cache_damaged,
            sidecars_cached=self.sidecars_cached,
            sidecars_fetched=self.sidecars_fetched,
            batches=self.consumer_batches,
            samples=self.consumer_samples,
            consumer_wait_seconds=self.consumer_wait_seconds,
            first_batch_seconds=self.consumer_first_batch_seconds,
            bound=bound,
            decode_workers=decode_workers,
            cpu_budget=cpu_budget,
        )
