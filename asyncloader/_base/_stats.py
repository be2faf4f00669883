"""Counters of the data path and the frozen snapshot ``loader.stats()`` returns.

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
from ._errors import first_keys
from ._latency import LatencyWindow
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
    decode_queue: int = 0  # jobs handed to the pool and not yet finished
    engine_restarts: int = 0  # engine processes that died and were replaced (the trainer's)
    batches_produced: int = 0
    ring_out: int = 0  # slots published: waiting for the consumer, or held by its batches
    ring_slots: int = 0
    listing_seconds: float = 0.0
    objects_listed: int = 0
    unnamed_images: int = 0  # left out: images the root's metadata file does not name
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

    def count_decode(self, outcome: Outcome, *, size: int = 0, caching: bool = False) -> None:
        """Account one decode job: the worker's busy time and its cache events.

        Args:
            outcome: What the job reported.
            size: The object's size, counted as read from the cache on a hit [bytes].
            caching: A cache is on: a sample decoded from fetched bytes was a miss.
        """
        events = outcome.events
        self.decode_seconds += outcome.busy
        if outcome.path is DecodePath.GPU:
            self.gpu_decoded += 1
        elif outcome.path is DecodePath.GPU_TO_CPU:
            self.gpu_to_cpu += 1
        elif outcome.path is DecodePath.GPU_SUSPECT:
            self.gpu_suspect += 1
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


@dataclass(frozen=True, slots=True)
class Stats:
    """A point-in-time view of the loader; every skip, retry and request is counted.

    Attributes:
        wall_seconds: Time since the loader started [seconds].
        requests: HTTP requests sent (retries included).
        bytes_fetched: Body bytes received from the store [bytes].
        retries: Retries by reason (``"throttled"``, ``"transient"``, ...).
        objects_fetched: Objects fully fetched and verified.
        mean_fetch_seconds: Mean wall time of one object fetch, retries included [seconds].
        inflight: Requests holding an in-flight slot right now; ``inflight_peak`` the most
            seen at once (with several engine processes: the sum of each one's most, at
            most ``max_inflight``).  A hedge holds no slot: ``hedges_sent`` counts them.
        max_inflight: The ceiling of requests in flight; ``inflight_limit`` the adaptive
            budget's limit now (see :class:`~asyncloader.FetchConfig`).
        backoffs: Times the budget backed off on a throttled answer (503, 429); of those,
            ``backoffs_followed`` for another loader's (the node's budget is shared).
        node_loaders: Loaders of this node sharing one budget for this URL (a cache folder
            is the node; see ``FetchConfig.node_budget``); 0: not shared.
        hedges_sent, hedges_won: Second requests sent for answers later than the deadline
            learned from this run's latencies, and those whose answer came first.
        request_p50, request_p90, request_p99: Latency quantiles of recent requests, from
            sending to the whole verified answer [seconds].
        decoded: Samples decoded into batch slots.
        decode_utilization: Busy fraction of the decode workers since start (0..1).
        decode_seconds: The decode workers' busy time since start, summed [seconds].
        gpu_decoded, gpu_to_cpu, gpu_suspect: With ``DecodeConfig(backend="cuda")``,
            where each sample was decoded: on the GPU (nvJPEG through torchvision, the
            image checked; torchvision does not say whether nvJPEG used the hardware
            decoder, nor how many engines it has), on the CPU because it was not given to
            the GPU (not a JPEG nvJPEG decodes) or the GPU refused it, and on the CPU
            because the GPU's image failed the check (the wrong size, or black
            throughout).  All 0 with the CPU backend.
        decode_queue: Decode jobs handed to the pool and not finished.
        samples_by_source: Samples delivered from each source (its URL), with several.
        engine_restarts: Engine processes that died and were replaced (see
            ``EngineConfig.max_restarts``); a replaced engine's counts are kept as it last
            reported them (to an earlier ``stats()``).
        skipped: Samples left out of delivered batches under ``on_error="skip"``, by error
            type; ``skipped_keys`` names the first 100 of them (shown as in messages).
        ring_full: Batch slots filled and waiting for the consumer (of ``ring_slots``).
        ring_held: Batch slots whose batch is still referenced — by the consumer (a batch
            keeps its slot until the last tensor or view of it is gone), or by the uploader
            while it copies.  When every slot is held, no batch can be made.
        cache_hits, cache_misses: Samples read from the SSD cache / not found there.  A
            sample whose object another batch was fetching into the cache, or whose bytes
            still waited for the cache's writer, is a hit: it shares those bytes.
        cache_scaled_hits: Of ``cache_hits``, samples decoded from a scaled copy of a large
            JPEG (``cache_scaled_jpegs``): the same pixels from a fraction of the data.
        bytes_from_cache: Bytes of the objects served from the SSD cache (a hit decoded
            from a scaled copy reads less of the disk; ``bytes_fetched``: from the network).
        cache_stored, cache_store_failed: Fetched objects written to the cache / not written
            (disk full, ...; not fatal).  Written by a thread of their own, in batches: a
            few may still be on their way when the epoch ends.
        cache_store_skipped: Fetched objects not cached because the disk was behind (64 MB
            waiting to be written): fetched again when next needed.
        cache_share: The share of the objects this node reads that the cache keeps: 1.0
            when they fit, else a fixed subset (picked by a hash of the key) that fills 90 %
            of ``cache_size``; the others are never written.
        cache_damaged: Cache entries that failed their length/CRC check, dropped and fetched.
        unnamed_images: Images left out because the root's metadata file does not name
            them (``extras=`` or a labels column read it; see docs/data.md).
        filtered_out: Samples ``filters=`` left out at listing time (never requested).
        sidecars_cached, sidecars_fetched: Sidecar files (``extras=``) read from the SSD
            cache, and fetched from the store.
        batches, samples: Delivered to the consumer.
        consumer_wait_seconds: Time the consumer spent waiting for a batch [seconds].
        first_batch_seconds: From start to the first batch delivered [seconds].
        bound: Which stage limits throughput: ``"consumer"`` (the loader keeps ahead: the
            training loop is the bound), ``"decode"`` (decode workers busy ≥ 80 %),
            ``"fetch"`` (the consumer waits while decode workers idle: storage-bound) or
            ``"cache"`` (the same, with most samples read from the SSD cache: its disk).
        decode_workers: The loader's decode workers.
        cpu_budget: The CPUs they were counted from, and who shares them ("" where the
            count was given).
    """

    wall_seconds: float
    requests: int
    bytes_fetched: int
    retries: dict[str, int]
    objects_fetched: int
    mean_fetch_seconds: float
    inflight: int
    inflight_peak: int
    max_inflight: int
    inflight_limit: int
    backoffs: int
    backoffs_followed: int
    node_loaders: int
    hedges_sent: int
    hedges_won: int
    request_p50: float
    request_p90: float
    request_p99: float
    decoded: int
    decode_utilization: float
    decode_queue: int
    skipped: dict[str, int]
    batches_produced: int
    ring_full: int
    ring_held: int
    ring_slots: int
    objects_listed: int
    unnamed_images: int
    filtered_out: int
    listing_seconds: float
    cache_hits: int
    cache_scaled_hits: int
    cache_misses: int
    bytes_from_cache: int
    cache_stored: int
    cache_store_failed: int
    cache_store_skipped: int
    cache_share: float
    cache_damaged: int
    sidecars_cached: int
    sidecars_fetched: int
    batches: int
    samples: int
    consumer_wait_seconds: float
    first_batch_seconds: float | None
    bound: Bound
    decode_workers: int = 0
    cpu_budget: str = ""
    engine_restarts: int = 0
    skipped_keys: tuple[str, ...] = ()
    samples_by_source: dict[str, int] = field(default_factory=dict)
    decode_seconds: float = 0.0
    gpu_decoded: int = 0
    gpu_to_cpu: int = 0
    gpu_suspect: int = 0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.wall_seconds

    @property
    def samples_ahead(self) -> int:
        """Samples decoded and not delivered: made ahead of the training loop (the ring's
        batches, the next epoch's first ones), or dropped by a restart (``set_epoch``,
        a resume)."""
        return max(self.decoded - self.samples - sum(self.skipped.values()), 0)

    def bound_in_words(self) -> str:
        """Which stage bounded the run, in words a newcomer understands (the same verdict
        as ``bound``)."""
        return {
            "decode": "decoding and resizing images: the decode workers were busy nearly "
            "all the time",
            "fetch": "waiting for the store: the decode workers were often idle, waiting for bytes",
            "cache": "reading the SSD cache: the decode workers were often idle, waiting for the "
            "disk (most samples came from the cache, not the store)",
            "consumer": "the training loop: the loader kept ahead of it",
        }.get(
            self.bound,
            f"too short a run to tell (fewer than {TELL_AFTER} batches: start-up weighs as "
            "much as streaming)",
        )

    def summary(self) -> str:
        """A few human lines of a loader's stats: throughput, the bounding stage, the cache,
        requests, retries and skips, sidecars, what each source gave."""
        mb = self.bytes_fetched / 1e6
        ahead = self.samples_ahead
        bound = self.bound if self.bound != "unknown" else "too short a run to tell"
        lines = [
            f"{self.samples} samples in {self.batches} batches, {self.wall_seconds:.1f} s "
            f"({self.samples_per_second:.0f} samples/s, {mb / self.wall_seconds:.1f} MB/s "
            "fetched)" + (f"; {ahead} more decoded ahead of the training loop" if ahead else ""),
            f"bound by: {bound}  (decode workers {self.decode_workers}"
            + (f" of {self.cpu_budget}" if self.cpu_budget else "")
            + f", consumer waited {self.consumer_wait_seconds:.1f} s, "
            f"decode busy {self.decode_utilization:.0%}, peak in flight "
            f"{self.inflight_peak}/{self.max_inflight} (limit now {self.inflight_limit}, "
            f"{self.backoffs} back-offs), mean fetch "
            f"{self.mean_fetch_seconds * 1e3:.1f} ms)",
            f"cache: {self.cache_hits} hits ({self.bytes_from_cache / 1e6:.0f} MB from disk"
            + (f"; {self.cache_scaled_hits} from scaled copies" if self.cache_scaled_hits else "")
            + "), "
            f"{self.cache_misses} misses, {self.cache_stored} stored, "
            f"{self.cache_damaged} damaged, {self.cache_store_failed} store failures, "
            f"{self.cache_store_skipped} not stored (disk behind)"
            + (
                f"; the data does not fit: {self.cache_share:.0%} of it is kept"
                if self.cache_share < 1.0
                else ""
            )
            if self.cache_hits or self.cache_misses
            else "cache: off",
            f"requests {self.requests} (p50/p90/p99 {self.request_p50 * 1e3:.0f}/"
            f"{self.request_p90 * 1e3:.0f}/{self.request_p99 * 1e3:.0f} ms; hedges "
            f"{self.hedges_sent} sent, {self.hedges_won} won), "
            f"retries {_counted(self.retries)}, skipped {_counted(self.skipped)}"
            + (f" [{first_keys(self.skipped_keys, 3)}]" if self.skipped_keys else "")
            + (f", engine restarts {self.engine_restarts}" if self.engine_restarts else ""),
        ]
        if len(self.samples_by_source) > 1:
            lines.append(
                "sources: "
                + ", ".join(f"{url} {n}" for url, n in sorted(self.samples_by_source.items()))
            )
        if self.gpu_decoded or self.gpu_to_cpu or self.gpu_suspect:
            lines.append(
                f"GPU decode: {self.gpu_decoded} on the GPU, {self.gpu_to_cpu} on the CPU "
                f"(not given to the GPU, or refused), {self.gpu_suspect} on the CPU after "
                "the GPU's image failed the check"
            )
        if self.unnamed_images:
            lines.append(f"images left out, not named by the metadata file: {self.unnamed_images}")
        if self.filtered_out:
            lines.append(f"samples left out by filters=: {self.filtered_out}")
        if self.sidecars_fetched or self.sidecars_cached:
            lines.append(
                f"sidecar files: {self.sidecars_fetched} fetched, {self.sidecars_cached} "
                "from the cache"
            )
        return "\n".join(line.rstrip() for line in lines)


def _counted(by_reason: dict[str, int]) -> str:
    """``3 (throttled 2, transient 1)``, or ``0``."""
    total = sum(by_reason.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {n}" for k, n in by_reason.items() if n) + ")"
