"""The composition root: a loader's options resolved into one plan, and the parts built from
it — the cache, the fetcher, the ring, the decode pool and the pipeline.

``ImageLoader`` builds a whole engine here; ``warm`` (the cache and the fetcher), ``describe``
and ``bench`` (the cache) take the parts they need from the same functions, so every default
is resolved once (in ``_base/_config.py``) and the rule of whether decode holds the GIL is
asked in one place (``_decode/_backend.py``).  Where the engine runs is the loader wing's
(``_loader/_start.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from .._base._config import (
    CacheConfig,
    DecodeConfig,
    EngineConfig,
    FetchConfig,
    RunConfig,
    StoreConfig,
    decode_window,
    decode_worker_count,
    ring_slots,
)
from .._base._env import CpuBudget, cpu_budget
from .._base._shm import SegmentRef
from .._base._sources import Source, as_sources
from .._base._stats import Counters
from .._base._types import DecodeFn, ObjectStore
from .._cache import ObjectCache
from .._dataset import Listing
from .._dataset._saved import budget_path
from .._decode import DecodePool, DecodeSpec, decode_holds_gil
from .._decode._image import takes_seed
from .._decode._transforms import RandomResizedCrop, Transform
from .._device._ring import BatchRing, DeviceBatchRing
from .._fetch import Fetcher
from .._stores import open_sources, open_store, store_options
from ._cache_fill import CacheFill
from ._notices import Outbox
from ._pipeline import Pipeline

if TYPE_CHECKING:
    import torch

__all__ = [
    "LoaderPlan",
    "loop_factory",
    "make_fetcher",
    "make_pipeline",
    "make_pool",
    "make_ring",
    "plan",
    "ship_arena",
]


@dataclass(frozen=True, slots=True)
class LoaderPlan:
    """Every setting of one loader, resolved: what its parts are built from.

    Attributes:
        spec: What each decode makes (shape, transform, hook, limits, the cache).
        workers: Decode workers (threads, or the GPU pool's host threads).
        backend: ``"thread"`` or ``"cuda"``.
        holds_gil: Decode holds the GIL (a hook, or Pillow): one engine process per decode
            worker by default, each with one decode thread.
        fetch: The fetch config, ``max_inflight`` resolved.
        run: Batch composition, shard and error policy.
        cache: How the SSD cache is kept.
        engine: Ring, limits and event loop.
        slots: Ring slots.
        window: Most samples between the start of their fetch and the end of their decode.
        budget: The CPUs the decode worker default was made from, and the node's ranks.
        ship_bytes: GPU decode with engine processes: each ring slot's room for the
            shipped JPEGs, per sample [bytes] (``DecodeConfig(ship_bytes=)``).
    """

    spec: DecodeSpec
    workers: int
    backend: Literal["thread", "cuda"]
    holds_gil: bool
    fetch: FetchConfig
    run: RunConfig
    cache: CacheConfig
    engine: EngineConfig
    slots: int
    window: int
    budget: CpuBudget
    ship_bytes: int = 0

    @property
    def object_cache(self) -> ObjectCache | None:
        """The SSD cache (the one decode reads hits from), or None."""
        cache = self.spec.cache
        assert cache is None or isinstance(cache, ObjectCache)
        return cache


def plan(
    *,
    run: RunConfig,
    transform: Transform | None,
    decode: DecodeConfig,
    fetch: FetchConfig,
    cache: CacheConfig,
    engine: EngineConfig,
    object_cache: ObjectCache | None,
    device: str | None,
) -> LoaderPlan:
    """Resolve a loader's options (every default from ``_base/_config.py``).

    Raises:
        ValueError: options that contradict each other, or a backend this machine lacks.
    """
    budget = cpu_budget(run.shard.local_world_size)  # the cgroup files read once
    n = decode_worker_count(decode.workers, run.shard.num_workers, budget=budget)
    hook = decode.hook
    if run.buckets is not None:
        _check_buckets(transform, decode)
        # A slot holds the largest bucket; each batch packs its own shape from the start.
        shape = (3, 1, run.buckets.max_pixels)
    elif hook is None:
        transform = transform or RandomResizedCrop(224)
        h, w = transform.output_size
        shape = (3, h, w)
        if decode.sample_shape is not None and tuple(decode.sample_shape) != shape:
            raise ValueError(
                f"DecodeConfig(sample_shape={tuple(decode.sample_shape)}) but images come out "
                f"as {shape} (transform={transform!r}): the transform sets the size of "
                "decoded images; sample_shape is for decode hooks"
            )
    else:
        assert decode.sample_shape is not None  # DecodeConfig holds it with a hook
        if transform is not None:
            raise ValueError(
                f"transform={transform!r} with DecodeConfig(hook=...): the hook makes the "
                "samples, and no transform would be applied"
            )
        shape = decode.sample_shape
    if decode.backend == "cuda":
        _check_gpu_decode(device, hook)
    if cache.scaled_jpegs and (object_cache is None or hook is not None):
        raise ValueError(
            "CacheConfig(scaled_jpegs=True) needs a cache_dir and the built-in decode "
            "(no decode hook)"
        )
    fetch = fetch.for_workers(n)
    # Hits of large JPEGs are decoded from their scaled copies wherever the cache has them
    # (made by CacheConfig(scaled_jpegs=True) or by `asyncloader warm --scaled-jpegs`):
    # same pixels.
    spec = DecodeSpec(
        shape,
        transform,
        hook,
        decode.max_pixels,
        object_cache,
        scaled_copies=object_cache is not None and hook is None,
        hook_seed=takes_seed(hook),
        buckets=run.buckets,
        exif_orientation=decode.exif_orientation,
    )
    return LoaderPlan(
        spec=spec,
        workers=n,
        backend=decode.backend,
        holds_gil=decode_holds_gil(decode_hook=hook is not None),
        fetch=fetch,
        run=run,
        cache=cache,
        engine=engine,
        slots=ring_slots(engine.prefetch_batches, fetch.inflight, run.batch_size),
        window=decode_window(fetch.inflight, n),
        budget=budget,
        ship_bytes=decode.ship_bytes,
    )


def open_the_store(
    url: str | Source | Sequence[str | Source],
    store: StoreConfig,
    labels: object,
    run: RunConfig,
) -> tuple[ObjectStore, dict[str, Any], tuple[Source, ...] | None]:
    """A loader's store: ``store.object_store`` as given, the store of one URL, or several
    sources' as one (:func:`~asyncloader._stores.open_sources`); the options engine
    processes open it with (several sources: the loader's, for those without their own),
    and the sources (None for one).

    Raises:
        ValueError: as :func:`~asyncloader._stores.open_store`; bad sources, or several
            with a node-local shuffle (``run``).
    """
    options = dict(store.options)
    given = store.object_store
    sources = as_sources(url, labels, options) if given is None else None  # type: ignore[arg-type]
    if sources:
        if run.shuffle == "node":
            raise ValueError("shuffle='node' reads one source: several are shuffled globally")
        return open_sources(sources), options, sources
    one = cast(str, url)
    opts = store_options(one, labels, options)
    return (given if given is not None else open_store(one, **opts)), opts, None


def make_fetcher(
    store: ObjectStore,
    counters: Counters,
    config: FetchConfig,
    folder: str | None,
    *,
    decode_workers: int | None = None,
) -> Fetcher:
    """The fetcher of ``store``: with a cache ``folder``, its in-flight budget shared by the
    node's loaders and ``warm`` of the same URL."""
    node = budget_path(folder, store.url) if folder is not None else None
    return Fetcher(store, counters, config, decode_workers=decode_workers, node=node)


def make_ring(
    p: LoaderPlan, device: torch.device | None, *, attach: SegmentRef | None = None
) -> BatchRing:
    """The batch buffers: on the GPU for GPU decode, else in this process; ``attach``: the
    ring the trainer made for this engine process."""
    shape, b = p.spec.sample_shape, p.run.batch_size
    if attach is not None:
        return BatchRing(p.slots, b, shape, shared=True, attach=attach, arena=ship_arena(p))
    if p.backend == "cuda":
        assert device is not None
        return DeviceBatchRing(p.slots, b, shape, device=device)
    return BatchRing(p.slots, b, shape, shared=False)


def make_pool(p: LoaderPlan, ring: BatchRing) -> DecodePool:
    """The decode workers of ``p.backend``, writing into ``ring``: GPU decode's pool on a
    ring on the GPU, its shipping threads on a shipped ring (an engine process's)."""
    from .._decode import ThreadDecodePool

    if p.backend == "cuda" and ring.arena is not None and ring.records is not None:
        from .._decode._ship import Shipper

        shipper = Shipper(p.spec, ring.images, ring.records, ring.arena)
        return ThreadDecodePool(p.workers, p.spec, ring.images, shipper)
    if p.backend == "cuda":
        from .._decode._gpu import GpuDecodePool

        return GpuDecodePool(p.workers, p.spec, ring.images)  # type: ignore[arg-type]
    return ThreadDecodePool(p.workers, p.spec, ring.images)


def ship_arena(p: LoaderPlan) -> int:
    """The arena of each slot of an engine process's ring [bytes]: GPU decode ships the
    JPEGs there (see :mod:`asyncloader._decode._ship`); 0 for the CPU backends."""
    return p.run.batch_size * p.ship_bytes if p.backend == "cuda" else 0


def make_pipeline(
    p: LoaderPlan,
    listing: Listing,
    fetcher: Fetcher,
    pool: DecodePool,
    ring: BatchRing,
    counters: Counters,
    output: Outbox,
    *,
    part: tuple[int, int] = (0, 1),
    ring_key: int = 0,
) -> Pipeline:
    """The pipeline of one loader over its parts (``part``: an engine process's share of
    the batches; ``ring_key``: how its notices name ``ring``), with its cache-fill stage
    over the plan's SSD cache."""
    cache = p.object_cache
    filling = (
        CacheFill.for_loader(
            cache,
            fetcher,
            counters,
            listing,
            p.run,
            scaled_copies=p.cache.scaled_jpegs,
            max_pixels=p.spec.max_pixels,
            # What was written while a batch was in flight: its ring slots' worth, twice.
            remember=2 * ring.slots * p.run.batch_size,
        )
        if cache is not None
        else None
    )
    return Pipeline(
        listing,
        fetcher,
        pool,
        ring,
        p.run,
        counters,
        output,
        decode_window=p.window,
        filling=filling,
        part=part,
        ring_key=ring_key,
    )


def _check_buckets(transform: Transform | None, decode: DecodeConfig) -> None:
    """Buckets crop every image to its bucket: no transform, hook or GPU decode beside them.

    Raises:
        ValueError: one of them given.
    """
    if transform is not None:
        raise ValueError(
            f"transform={transform!r} with buckets=: each image is resized and cropped to "
            "its bucket (Buckets(crop=, hflip=) say how)"
        )
    if decode.hook is not None:
        raise ValueError("buckets= crops images; a DecodeConfig(hook=) makes samples of one shape")
    if decode.backend == "cuda":
        raise ValueError("buckets= decodes on the CPU: not DecodeConfig(backend='cuda')")


def _check_gpu_decode(device: str | None, hook: DecodeFn | None) -> None:
    """``DecodeConfig(backend="cuda")``'s needs, checked before any work starts."""
    if hook is not None:
        raise ValueError("DecodeConfig(backend='cuda') decodes JPEGs itself: it takes no hook")
    if device is None or not device.startswith("cuda"):
        raise ValueError(
            f"DecodeConfig(backend='cuda') decodes into the GPU's memory: it needs "
            f"device='cuda' (or 'cuda:N'), not device={device!r}"
        )
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "DecodeConfig(backend='cuda') needs a CUDA device, and torch.cuda.is_available() "
            "is False here: use DecodeConfig(backend='thread')"
        )
    from .._decode._gpu_batch import require_torchvision

    require_torchvision()


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop maker ``EngineConfig(event_loop=)`` names (checked there)."""
    if name == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        raise ImportError(
            "event_loop='uvloop' needs uvloop: pip install 'asyncloader[uvloop]'"
        ) from exc
    return uvloop.new_event_loop  # type: ignore[no-any-return]
