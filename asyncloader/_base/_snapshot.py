"""The frozen snapshot ``loader.stats()`` returns, and its summary in words (made from the
counters by :meth:`~._stats.Counters.snapshot`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._bound import TELL_AFTER, Bound
from ._errors import first_keys

__all__ = ["Stats"]


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
            image checked), on the CPU because it was not given to the GPU (not a JPEG
            nvJPEG decodes) or the GPU refused it, and on the CPU because the GPU's image
            failed the check (the wrong size, or black throughout).  All 0 with the CPU
            backend.
        gpu_hardware: Of ``gpu_decoded``, the samples nvJPEG's hardware JPEG decoder
            decoded (the rest, with CUDA kernels): JPEGs its batched hardware decode
            takes, on a GPU that has hardware engines, asked of nvJPEG as torchvision
            asks it (torchvision does not report it).
        gpu_engines: The hardware JPEG engines nvJPEG reports on the GPU (0: none, every
            JPEG decoded with CUDA kernels); None where it was not asked (the CPU
            backend, before the first batch) or could not be (no ``libnvjpeg`` found in
            the process).
        gpu_shipped: With ``DecodeConfig(backend="cuda")`` and engine processes: samples
            whose JPEG an engine shipped to the training process, which decoded them on its
            GPU (then counted in ``gpu_decoded``, or on the CPU in ``gpu_to_cpu`` or
            ``gpu_suspect``, or skipped).
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
        unnamed_images: Images left out because no metadata file (the root's, its
            folders') names them (``extras=`` or a labels column read it; see docs/data.md).
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
    gpu_shipped: int = 0
    gpu_hardware: int = 0
    gpu_engines: int | None = None

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
            engines = (
                "hardware decoder not known"
                if self.gpu_engines is None
                else f"{self.gpu_hardware} by the hardware decoder, {self.gpu_engines} engines"
            )
            lines.append(
                f"GPU decode: {self.gpu_decoded} on the GPU ({engines}), "
                f"{self.gpu_to_cpu} on the CPU "
                f"(not given to the GPU, or refused), {self.gpu_suspect} on the CPU after "
                "the GPU's image failed the check"
                + (
                    f"; {self.gpu_shipped} shipped by the engines to the training process"
                    if self.gpu_shipped
                    else ""
                )
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
