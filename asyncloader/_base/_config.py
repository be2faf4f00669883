"""Validated run settings shared by the pipeline and the loader (a leaf module)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._buckets import GEOMETRY, Buckets
from ._env import CpuBudget, cpu_budget, local_world_size
from ._filters import Normal, normalize
from ._types import DecodeFn, ObjectInfo, ObjectStore

__all__ = [
    "CACHE_SIZE",
    "IMAGE_EXTENSIONS",
    "LIST_CONCURRENCY",
    "READ_TIMEOUT",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LISTING_MAX_AGE",
    "MAX_PIXELS",
    "PROCESS_BACKEND_GONE",
    "CacheConfig",
    "DecodeConfig",
    "EngineConfig",
    "ErrorConfig",
    "FetchConfig",
    "OnError",
    "OutputConfig",
    "RunConfig",
    "ShardConfig",
    "StoreConfig",
    "decode_window",
    "decode_worker_count",
    "default_max_inflight",
    "engine_processes",
    "ring_slots",
]

# Per-channel RGB statistics on the 0..1 scale: the usual normalisation for ImageNet models.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

OnError = Literal["raise", "skip"]

# The keys a loader keeps by default: the image formats Pillow reads.
IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".webp",
    ".bmp",
    ".tif",
    ".tiff",
    ".gif",
    ".ppm",
    ".pgm",
)

# The most bytes an SSD cache keeps unless told (loader, warm, ls, the CLI).
CACHE_SIZE = "100GB"
# Sources with more pixels are refused (decompression bombs), by default: Pillow's limit.
MAX_PIXELS = 89_478_485
# How old a saved listing may be and still be used instead of listing again [seconds].
LISTING_MAX_AGE = 3600.0
# The HTTP stores: the longest wait for an answer to start, and then between two reads of
# it, before a stalled connection is abandoned and the request retried [seconds]; and the
# sub-folders (or key ranges) listed at once.
READ_TIMEOUT = 60.0
LIST_CONCURRENCY = 32


def decode_worker_count(
    given: int | None,
    num_workers: int = 1,
    ranks: int | None = None,
    budget: CpuBudget | None = None,
) -> int:
    """The one default of the decode worker count: this process's CPU budget (its affinity
    mask or its container's quota, whichever is smaller) shared among the ranks of its node
    (``ranks``, else the environment's ``LOCAL_WORLD_SIZE`` or SLURM's), less a core for
    each training process where a rank has 3 or more, then among the ``num_workers``
    DataLoader workers that each run a loader, at least 1 (see
    :meth:`~._env.CpuBudget.decode_workers`).  ``budget``: one read already."""
    return given or (budget or cpu_budget(ranks)).decode_workers(num_workers)


WORKERS_PER_ENGINE = 4
"""Decode workers one engine process feeds.  Its event loop spends 0.2-0.35 ms of CPU per
image (``bench_scale.py``, 2 cores), under the one GIL that its decode threads also take
for their Python parts: on 2 cores two engines of one decode thread made 1.00-1.31× the
images of one engine of two (two runs), and with a trivial decode the busiest thread's
bound rose from 3 600 to 5 400 images/s.  Four cores' worth of decode (about 1 000
images/s of 224-pixel crops) keeps a loop under a third of its core."""


def engine_processes(given: int | None, workers: int, *, holds_gil: bool = False) -> int:
    """The one default of the engine process count: one per :data:`WORKERS_PER_ENGINE`
    decode workers (rounded up); one per decode worker where decode holds the GIL
    (``holds_gil``: see ``_decode/_backend.py``), each engine then decoding on one thread."""
    if given is not None:
        return given
    return max(1, workers if holds_gil else -(-workers // WORKERS_PER_ENGINE))


def default_max_inflight(workers: int) -> int:
    """The one default of ``max_inflight``: 64 requests per worker (a decode worker of a
    loader; a usable CPU for ``warm``), at least 64.

    Throughput ≈ requests in flight / latency: 64 hide 50 ms of first-byte latency at
    ~1 300 objects/s, about three times what one core decodes.
    """
    return max(64, 64 * workers)


def ring_slots(prefetch_batches: int | None, inflight: int, batch_size: int) -> int:
    """The one default of the ring's slot count: ``prefetch_batches`` if given, else enough
    batches for the requests in flight plus 4, at least 5 (one more than the work in
    flight needs: a plain ``for`` loop still holds the previous batch while it asks for the
    next)."""
    return prefetch_batches or max(5, -(-inflight // batch_size) + 4)


def decode_window(inflight: int, workers: int) -> int:
    """The most samples between fetch and decode: the requests in flight, plus 4 per decode
    worker so that no worker waits for its next job."""
    return inflight + 4 * workers


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchConfig:
    """How objects are fetched.

    Attributes:
        max_inflight: The most requests in flight at once (throughput ≈ requests in flight
            / latency); None: :func:`default_max_inflight` of the worker count.  With
            ``adaptive``, the ceiling of the adaptive budget.
        adaptive: Adapt the requests in flight between ``min_inflight`` and
            ``max_inflight``: sized by Little's law (``inflight_headroom`` × the rate decode
            absorbs × the time a request takes), multiplied by ``throttle_decrease`` on a
            throttled answer (503 SlowDown, 429) and grown by one per window of answers.
            False: always ``max_inflight``.
        min_inflight: The fewest requests in flight the adaptive budget goes down to.
            It starts at 16 (at most ``max_inflight``) and doubles per round of answers up
            to ``max_inflight`` until the first throttled answer (as TCP's slow start).
        throttle_decrease: Factor of the budget on throttling (once per round of requests).
        node_budget: With a cache folder, the loaders of the node that read the same URL
            into it (ranks, DataLoader workers, ``warm``) share their back-offs and divide
            their growth, so that together they respect the store's rate as one client.
        inflight_headroom: Requests in flight over what Little's law says is needed.
        max_attempts: Tries per request for throttling and transient errors.
        backoff_base: First retry's mean delay; doubles per attempt, full jitter [seconds].
        backoff_cap: Longest retry delay [seconds].
        range_threshold: Objects larger than this are fetched as parallel ranges [bytes].
        part_size: Size of each range [bytes].
        hedge: Send a second, identical request when one is not answered within a deadline
            learned from this run's latencies; the first complete, verified answer wins.
        hedge_quantile, hedge_factor, hedge_floor: The deadline: ``hedge_factor`` × the
            ``hedge_quantile`` of recent request latencies, at least ``hedge_floor``
            [seconds].
        hedge_share: Hedges sent stay below this share of the requests sent (plus a burst
            of ``hedge_min_inflight``), so they can never double the load.
        hedge_min_inflight: Hedges in flight at once: at least this, at most 1/16 of
            ``max_inflight`` when that is more.
        hedge_min_samples: Latencies observed before any hedge (the deadline needs them).
    """

    max_inflight: int | None = None
    adaptive: bool = True
    min_inflight: int = 2
    throttle_decrease: float = 0.5
    node_budget: bool = True
    inflight_headroom: float = 2.0
    max_attempts: int = 10
    backoff_base: float = 0.05
    backoff_cap: float = 5.0
    range_threshold: int = 16 << 20
    part_size: int = 8 << 20
    hedge: bool = True
    hedge_quantile: float = 0.95
    hedge_factor: float = 2.0
    hedge_floor: float = 0.02
    hedge_share: float = 0.05
    hedge_min_inflight: int = 4
    hedge_min_samples: int = 64

    def __post_init__(self) -> None:
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if self.min_inflight < 1 or not 0 < self.throttle_decrease < 1:
            raise ValueError("need min_inflight >= 1 and 0 < throttle_decrease < 1")
        if self.inflight_headroom < 1:
            raise ValueError("inflight_headroom must be at least 1")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.part_size < 1 or self.range_threshold < self.part_size:
            raise ValueError("need 0 < part_size <= range_threshold")
        if not 0 < self.hedge_quantile < 1 or self.hedge_factor < 1 or self.hedge_floor < 0:
            raise ValueError("need 0 < hedge_quantile < 1, hedge_factor >= 1, hedge_floor >= 0")
        if not 0 <= self.hedge_share <= 1 or self.hedge_min_inflight < 1:
            raise ValueError("need 0 <= hedge_share <= 1 and hedge_min_inflight >= 1")

    def for_workers(self, workers: int) -> FetchConfig:
        """This config with ``max_inflight`` set (its default for ``workers`` if None)."""
        if self.max_inflight is not None:
            return self
        return dataclasses.replace(self, max_inflight=default_max_inflight(workers))

    @property
    def inflight(self) -> int:
        """``max_inflight``, which must be set (see :meth:`for_workers`)."""
        if self.max_inflight is None:
            raise ValueError("max_inflight is not set: call for_workers() first")
        return self.max_inflight

    def backoff(self, attempt: int) -> float:
        """Upper bound of the delay before retry ``attempt`` (1, 2, ...); callers draw a
        uniform delay below it (full jitter) [seconds]."""
        return float(min(self.backoff_cap, self.backoff_base * 2 ** (attempt - 1)))


SHIP_BYTES = 512 << 10
"""``DecodeConfig(ship_bytes=)``'s default [bytes per sample]: JPEGs of up to 512 KiB on
average (ImageNet's are about 110 KB) reach the GPU, a batch's large ones in the room of
its small ones."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig:
    """How samples are decoded.

    Attributes:
        workers: Decode threads (None: the CPUs this process may use — its affinity mask
            or its container's CPU quota, whichever is smaller — divided among the ranks of
            its node (``LOCAL_WORLD_SIZE``, SLURM's tasks per node, or
            ``ShardConfig(local_world_size=)``), less a core for the training step where a
            rank has 3 or more, then among its DataLoader workers; ``repr`` and ``stats()``
            say where the count came from).  They run in the engine processes: one engine
            per 4 of them, or one per decode worker, each with one thread, where decode
            holds the GIL (a ``hook``, or Pillow without the region decoder and resize
            extensions; ``EngineConfig(processes=)`` sets the count).
        backend: ``"thread"`` (default): decode threads on the CPU.  ``"cuda"``: JPEGs are
            decoded on the GPU of ``device=`` (nvJPEG through torchvision, batched) and
            cropped and resized there by the same plan.  With engine processes (the
            default) the engines' ``workers`` threads fetch, read the cache and the header
            and plan the crop, and ship each JPEG to the training process, which decodes
            the batch on its GPU (``_decode/_ship.py``, ``_decode/_gpu_batch.py``); with
            the engine in the training process its threads do that work there and the
            batch lands in a ring on the device (``_decode/_gpu.py``).  Either way what
            nvJPEG is not given is decoded on the CPU.  Needs ``device="cuda"``.
        hook: A decode hook ``bytes -> uint8 array of sample_shape`` for other blob types
            (replaces the built-in JPEG decode and ``transform``).
        sample_shape: (C, H, W) of a sample; needed with ``hook``.  Images get theirs from
            the loader's ``transform`` (3 × its output size); a different one is an error.
        max_pixels: Sources with more pixels are refused (decompression bombs); by default
            Pillow's ``Image.MAX_IMAGE_PIXELS``.  A larger value raises Pillow's limit (a
            setting of the process) to it where images are decoded.
        ship_bytes: With ``backend="cuda"`` and the engine in processes of its own (the
            default), the engines ship each JPEG to the training process, which decodes
            the batch on its GPU: the room each ring slot has for them, per sample of its
            batch [bytes].  A batch's JPEGs share their slot's room; one that no longer
            fits is decoded on the CPU by its engine (``stats().gpu_to_cpu``).  Reserved
            with the rings: slots × ``batch_size`` × ``ship_bytes`` of memory (512 KiB: a
            batch of 256 in 5 slots, 640 MiB).
        exif_orientation: Turn each image upright by its EXIF orientation (the tag a phone
            or camera writes instead of turning the pixels) before the crop, as Hugging
            Face's ``datasets`` and ``ImageOps.exif_transpose`` do: the crop is planned, an
            aspect-ratio bucket chosen and ``original_size`` given for the upright image.
            Default False: the pixels as stored, as Pillow and torchvision decode them.
            With ``backend="cuda"`` a turned JPEG is decoded on the CPU.

    Raises:
        ValueError: a value out of range; ``backend="process"`` (gone: the message says
            what runs instead).
    """

    workers: int | None = None
    backend: Literal["thread", "cuda"] = "thread"
    hook: DecodeFn | None = None
    sample_shape: tuple[int, int, int] | None = None
    max_pixels: int = MAX_PIXELS
    ship_bytes: int = SHIP_BYTES
    exif_orientation: bool = False

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"DecodeConfig(workers={self.workers}): at least 1")
        if self.ship_bytes < 1:
            raise ValueError(f"DecodeConfig(ship_bytes={self.ship_bytes}): at least 1")
        if str(self.backend) == "process":  # a string from anywhere, not the Literal's
            raise ValueError(PROCESS_BACKEND_GONE)
        if self.backend not in ("thread", "cuda"):
            raise ValueError(
                f"DecodeConfig(backend={self.backend!r}): 'thread' (the CPU) or 'cuda'"
            )
        if self.hook is not None and not callable(self.hook):
            raise TypeError(f"DecodeConfig(hook=...) must be callable, not {self.hook!r}")
        shape = self.sample_shape
        if shape is not None and (len(shape) != 3 or min(shape) < 1):
            raise ValueError(f"DecodeConfig(sample_shape={shape!r}): (C, H, W), each >= 1")
        if self.hook is not None and shape is None:
            raise ValueError("DecodeConfig(hook=...) needs sample_shape=(C, H, W)")
        if self.hook is not None and self.exif_orientation:
            raise ValueError(
                "DecodeConfig(exif_orientation=True) with a decode hook: the hook decodes "
                "the bytes, orientation included (PIL.ImageOps.exif_transpose in it)"
            )
        if self.max_pixels < 1:
            raise ValueError("DecodeConfig(max_pixels=) must be at least 1")


PROCESS_BACKEND_GONE = (
    "decode_backend='process' is gone: decode runs on threads of the engine processes, and "
    "where it holds the GIL (a decode hook, or JPEGs without the _jpegroi/_resize "
    "extensions) the loader runs one engine process per decode worker, each decoding on one "
    "thread (the default: DecodeConfig(backend='thread')); EngineConfig(processes=N) sets "
    "how many"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Where the objects come from, beyond the URL.

    Attributes:
        options: Keyword options for the store (``endpoint_url``, ``anonymous``,
            ``region``, ``profile``, ``max_connections``, ...: the stores page of the docs).
        object_store: An :class:`~asyncloader.ObjectStore` to read instead of the URL's
            (it lives in this process: the engine runs here, on a thread).
        objects: The URL's object list, listed already (by the training process for its
            DataLoader workers, by rank 0 for every rank: see ``asyncloader.torch``): the
            store is not listed.
        extensions: Keys to keep (ignored with a manifest); None keeps every object.
    """

    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    object_store: ObjectStore | None = None
    objects: Sequence[ObjectInfo] | None = None
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS

    def __post_init__(self) -> None:
        if not isinstance(self.options, Mapping):
            raise TypeError(f"StoreConfig(options=...) is a dict, not {self.options!r}")
        if isinstance(self.extensions, str):
            raise TypeError(f"StoreConfig(extensions=...) is a tuple, not {self.extensions!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorConfig:
    """What happens to samples that fail.

    Attributes:
        on_error: ``"raise"``: the first failed sample stops the run with a clear error;
            ``"skip"``: failed samples are left out of their batch and counted
            (``stats().skipped``, and named: ``stats().skipped_keys``).
        max_failures: Under ``"skip"``, the most failures tolerated per epoch: a count
            (int) or a fraction of the epoch's samples (float < 1).
    """

    on_error: OnError = "raise"
    max_failures: int | float = 0.01

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {self.on_error!r}")
        if self.max_failures < 0:
            raise ValueError("max_failures must be >= 0")

    def budget(self, epoch_samples: int | None) -> float:
        """Skips tolerated in an epoch of ``epoch_samples`` (None: not known yet, so a
        fraction tolerates any number for now)."""
        if isinstance(self.max_failures, float) and self.max_failures < 1:
            if epoch_samples is None:
                return math.inf
            return int(self.max_failures * epoch_samples)
        return int(self.max_failures)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardConfig:
    """How a rank's share of each epoch is laid out beyond ``rank``/``world_size``.

    Attributes:
        local_world_size: Ranks per node (``LOCAL_WORLD_SIZE`` under torchrun), for
            ``shuffle="node"`` (each node keeps a stable subset and shuffles within it);
            None: one node.
        worker, num_workers: Within the rank's shard, take only batches ``worker, worker +
            num_workers, ...`` (one loader per DataLoader worker, whose round-robin output
            is then the rank's batch order; ``asyncloader.torch`` sets them).
        even: How ranks get equal sample counts (uneven counts hang DDP): ``"pad"``
            repeats samples from the start of the epoch's order to fill the last round;
            ``"drop"`` leaves out the last, incomplete round (at most ``world_size - 1``
            samples per epoch).
        drop_last: Drop the short last batch of each epoch.
    """

    local_world_size: int | None = None
    worker: int = 0
    num_workers: int = 1
    even: Literal["pad", "drop"] = "pad"
    drop_last: bool = False

    def for_shuffle(self, shuffle: bool | str) -> ShardConfig:
        """This layout, with the node's ranks from the environment (``LOCAL_WORLD_SIZE``,
        SLURM's) where a node-local shuffle needs them and none were given."""
        if shuffle != "node" or self.local_world_size is not None:
            return self
        return dataclasses.replace(self, local_world_size=local_world_size())

    def __post_init__(self) -> None:
        if self.local_world_size is not None and self.local_world_size < 1:
            raise ValueError(f"local_world_size must be at least 1, not {self.local_world_size}")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker {self.worker} is not one of {self.num_workers}")
        if self.even not in ("pad", "drop"):
            raise ValueError(f"even must be 'pad' or 'drop', not {self.even!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What goes into each batch, whose share it is, and what happens to samples that fail
    (the loader's day-one options and its shard and error configs, checked together).

    Attributes:
        batch_size: Samples per batch.
        shuffle: ``True``/``"global"``: a new seeded permutation of the whole dataset each
            epoch; ``"node"``: node-local (each node of ``shard.local_world_size`` ranks
            keeps a stable subset and shuffles within it; see the sampler); ``False``:
            listing order.
        seed: Seed of the permutation and of the augmentations.
        rank, world_size: This process's shard of each epoch.
        shard: The layout within it (node, DataLoader worker, even counts, drop_last).
        errors: What happens to samples that fail.
        extras: What each sample carries besides its label, by name: columns of the
            root's ``metadata.jsonl``/``.csv``, same-stem sidecar files by suffix
            (``"txt"``, ``"json"``), ``"source"``; batches are then ``(images, labels,
            extras)``.
        samples_per_epoch: Samples in each epoch (None: the dataset's size); with several
            sources shared among them by weight (``asyncloader.Source``).
        buckets: Aspect-ratio buckets (:class:`~._buckets.Buckets`): each image resized to
            cover the bucket nearest its shape and cropped to it, every batch one bucket
            (``[B, 3, h, w]``); None: every image to ``transform``'s size.
        filters: The samples kept, in pyarrow's form over the metadata file's columns and
            the listing's (``[("aesthetic", ">=", 5)]``; see
            :mod:`asyncloader._base._filters`), applied at listing time: a sample left out
            is never requested.  Kept in canonical form (:func:`~._filters.normalize`).
        upright: The images are turned upright by their EXIF orientation
            (``DecodeConfig(exif_orientation=True)``, which sets it): a bucketed run's
            buckets are the upright images' shapes, so its epoch's batches, and its resume
            state, are those of the upright images.
    """

    batch_size: int
    shuffle: bool | Literal["global", "node"] = True
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    shard: ShardConfig = ShardConfig()
    errors: ErrorConfig = ErrorConfig()
    extras: tuple[str, ...] = ()
    samples_per_epoch: int | None = None
    filters: Normal | None = None
    buckets: Buckets | None = None
    upright: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", normalize(self.filters))
        if self.buckets is not None and self.shuffle == "node":
            raise ValueError(
                "buckets= deals whole batches of the epoch's order: a global shuffle "
                "(shuffle=True) or none, not shuffle='node'"
            )
        if self.samples_per_epoch is not None and self.samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be at least 1, not {self.samples_per_epoch}")
        if self.samples_per_epoch is not None and self.shuffle == "node":
            raise ValueError("samples_per_epoch draws from the whole dataset: not shuffle='node'")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if isinstance(self.extras, str) or not all(
            isinstance(e, str) and e.strip(".") for e in self.extras
        ):
            raise ValueError(f"extras must be a tuple of names, not {self.extras!r}")
        if len(set(self.extras)) != len(self.extras):
            raise ValueError(f"extras names one thing twice: {self.extras!r}")
        geometry = [e for e in self.extras if e in GEOMETRY]
        if geometry and self.buckets is None:
            raise ValueError(
                f"extras {', '.join(map(repr, geometry))}: each sample's size before its "
                "bucket's crop and the crop's corner come with aspect-ratio buckets "
                "(buckets=asyncloader.make_buckets(...)); without them every image is "
                "cropped by the transform"
            )
        if self.shuffle not in (True, False, "global", "node"):
            raise ValueError(
                f"shuffle must be True, False, 'global' or 'node', not {self.shuffle!r}"
            )
        local = self.shard.local_world_size
        if local is not None and self.world_size % local:
            raise ValueError(
                f"local_world_size={local} does not divide world_size={self.world_size} "
                "into whole nodes"
            )
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfig:
    """How the SSD cache of ``cache_dir`` is kept.

    Attributes:
        size: Most bytes the cache keeps (``"500GB"``, ``"64GiB"``, an int); the least
            recently stored entries are evicted.
        scaled_jpegs: Also keep, beside each JPEG of at least 1 MiB, copies that decode at
            1/4 and 1/8 scale to exactly its pixels from a fraction of its data.  Later
            epochs decode such photos several times faster; making them costs ~3 decodes
            of the photo, once, on the cache's writer thread, and ~65 % more cache space
            for those objects; objects it cannot keep up with are not cached that epoch
            (``cache_store_skipped``).  ``asyncloader warm --scaled-jpegs`` makes them
            ahead of a run on every core.  Copies in the cache are used whether or not this is set.
        listing_max_age: Reuse the saved object list of the URL if younger than this
            [seconds]; objects replaced since then fail their ETag check clearly.
        refresh_listing: List the store again even if a saved list is young enough.
        group_shared: Make a missing cache folder for the owner's group too
            (``drwxrws---``) instead of the owner only.
    """

    size: int | str = CACHE_SIZE
    scaled_jpegs: bool = False
    listing_max_age: float = LISTING_MAX_AGE
    refresh_listing: bool = False
    group_shared: bool = False

    def __post_init__(self) -> None:
        if self.listing_max_age < 0:
            raise ValueError("listing_max_age must be >= 0")

    @property
    def max_age(self) -> float:
        """How old a saved listing may be and still serve [seconds] (0 with
        ``refresh_listing``)."""
        return 0.0 if self.refresh_listing else self.listing_max_age


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputConfig:
    """How batches are converted for ``device=`` (besides ``dtype``).

    Attributes:
        mean, std: Per channel on the 0..1 scale (ImageNet's by default); None: 0 and 1.
            One value, or one per channel.
        channels_last: Deliver images in ``torch.channels_last`` memory format.
        pin: CUDA: ``"register"`` page-locks the ring in place, ``"staging"`` copies
            through pinned buffers, ``"auto"`` registers and falls back to staging.
    """

    mean: Sequence[float] | None = IMAGENET_MEAN
    std: Sequence[float] | None = IMAGENET_STD
    channels_last: bool = False
    pin: Literal["auto", "register", "staging"] = "auto"

    def __post_init__(self) -> None:
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and (isinstance(values, str) or len(values) not in (1, 3)):
                raise ValueError(f"OutputConfig({name}=...): one value or one per channel")
        if self.std is not None and min(self.std) <= 0:
            raise ValueError(f"OutputConfig(std={self.std!r}): every value above 0")
        if self.pin not in ("auto", "register", "staging"):
            raise ValueError(f"pin must be 'auto', 'register' or 'staging', not {self.pin!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """Where the loader's engine runs, and its buffers, limits and event loop.

    Attributes:
        mode: ``"process"`` (default): fetch, cache fill and decode run in engine
            processes that write batches into shared memory; the training process only
            maps the batches, gives their slots back and, with ``device=``, uploads them.
            ``"inline"``: all of it on an event-loop thread of the training process (for
            notebooks and debugging).  The loader runs inline by itself, with one warning,
            where engine processes cannot run (no shared memory, a hook that cannot
            be pickled), and without one inside a DataLoader worker (already a process of
            its own) and with ``StoreConfig(object_store=)`` (it lives in this process).
            With ``DecodeConfig(backend="cuda")`` the engine processes ship each JPEG and
            the training process decodes the batch on its GPU; inline, the batch is
            decoded into a ring on the GPU by threads of the training process.
        processes: Engine processes (None: one per 4 decode workers, rounded up, or one
            per decode worker where decode holds the GIL); each fetches and decodes every
            n-th batch with its share of the decode workers, the requests in flight and the
            ring.
        prefetch_batches: Ring slots: batches filling, waiting, or still referenced by the
            consumer (None: :func:`ring_slots`, at least 5).  Memory is
            ``prefetch_batches × batch bytes``.
        event_loop: ``"asyncio"`` or ``"uvloop"`` (``pip install 'asyncloader[uvloop]'``):
            over HTTPS it costs ~20 % less client CPU per GET (``bench_get_cpu.py``).
        max_restarts: Engine processes replaced per epoch.  An engine process that dies
            (killed by the out-of-memory killer, say) is replaced where it stopped: the
            epoch goes on, every sample once, in the seed's order.  One more death in the
            same epoch raises ``PipelineDeadError``, naming how the engine ended (0: the
            first death raises).
    """

    mode: Literal["process", "inline"] = "process"
    processes: int | None = None
    prefetch_batches: int | None = None
    event_loop: Literal["asyncio", "uvloop"] = "asyncio"
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if self.mode not in ("process", "inline"):
            raise ValueError(f"mode must be 'process' or 'inline', not {self.mode!r}")
        if self.processes is not None and self.processes < 1:
            raise ValueError("processes must be at least 1 (mode='inline' runs no engine process)")
        if self.prefetch_batches is not None and self.prefetch_batches < 1:
            raise ValueError("prefetch_batches must be at least 1")
        if self.event_loop not in ("asyncio", "uvloop"):
            raise ValueError(f"event_loop must be 'asyncio' or 'uvloop', not {self.event_loop!r}")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be at least 0")
