"""The composition root: a loader's options resolved into one plan, and the parts built from
it — the cache, the fetcher, the ring, the decode pool and the pipeline.

``ImageLoader`` builds a whole engine here; ``warm`` (the cache and the fetcher), ``describe``
and ``bench`` (the cache) take the parts they need from the same functions, so every default
is resolved once (in ``_base/_config.py``) and the decode-backend rule is asked in one place
(``_decode/_backend.py``).  Options that moved into the grouped configs keep working for a
release through :func:`fold_moved`, with a ``DeprecationWarning`` naming the new spelling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import queue
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from .._base._config import (
    CacheConfig,
    EngineConfig,
    FetchConfig,
    OutputConfig,
    RunConfig,
    ShardConfig,
    decode_window,
    decode_worker_count,
    engine_processes,
    ring_slots,
)
from .._base._env import CpuBudget, cpu_budget
from .._base._shm import USE_MEMFD, SegmentRef
from .._base._sources import Source, as_sources
from .._base._stats import Counters
from .._base._types import DecodeFn, ObjectStore
from .._cache import ObjectCache
from .._dataset import Listing
from .._dataset._saved import budget_path
from .._decode import DecodePool, DecodeSpec, choose_backend
from .._decode._transforms import RandomResizedCrop, Transform
from .._device._ring import BatchRing, DeviceBatchRing
from .._fetch import Fetcher
from .._stores import open_sources, open_store, store_options
from ._cache_fill import CacheFill
from ._notices import Notice
from ._pipeline import Pipeline

if TYPE_CHECKING:
    import torch

__all__ = [
    "MOVED",
    "DecodeBackend",
    "LoaderPlan",
    "fold_moved",
    "loop_factory",
    "make_fetcher",
    "make_pipeline",
    "make_pool",
    "make_ring",
    "open_cache",
    "plan",
    "split_plan",
    "engine_placement",
]

DecodeBackend = Literal["auto", "thread", "process", "cuda"]
Configs = dict[str, Any]

# The loader's options that moved into a grouped config: old keyword -> (config, field).
MOVED: dict[str, tuple[str, str]] = {
    "cache_size": ("cache", "size"),
    "cache_scaled_jpegs": ("cache", "scaled_jpegs"),
    "listing_max_age": ("cache", "listing_max_age"),
    "refresh_listing": ("cache", "refresh_listing"),
    "local_world_size": ("shard", "local_world_size"),
    "worker": ("shard", "worker"),
    "num_workers": ("shard", "num_workers"),
    "even": ("shard", "even"),
    "mean": ("output", "mean"),
    "std": ("output", "std"),
    "channels_last": ("output", "channels_last"),
    "pin": ("output", "pin"),
    "prefetch_batches": ("engine", "prefetch_batches"),
    "max_pixels": ("engine", "max_pixels"),
    "event_loop": ("engine", "event_loop"),
}
CONFIG_TYPES: dict[str, type] = {
    "cache": CacheConfig,
    "shard": ShardConfig,
    "output": OutputConfig,
    "engine": EngineConfig,
}


def fold_moved(owner: str, old: dict[str, Any], configs: Configs) -> Configs:
    """``configs`` (name -> config or None) with each deprecated keyword of ``old`` folded
    into its config (over what the config says), each with a ``DeprecationWarning`` that
    names the new spelling.  Every config comes back made (its defaults where None).

    Raises:
        TypeError: a keyword of ``old`` that the loader never had.
    """
    out = {name: configs.get(name) or kind() for name, kind in CONFIG_TYPES.items()}
    for key, value in old.items():
        if key not in MOVED:
            raise TypeError(f"{owner}() got an unexpected keyword argument {key!r}")
        name, field = MOVED[key]
        kind = CONFIG_TYPES[name]
        warnings.warn(
            f"{owner}({key}=...) is now {owner}({name}={kind.__name__}({field}=...)); "
            "the old keyword goes in a future release",
            DeprecationWarning,
            stacklevel=3,
        )
        out[name] = dataclasses.replace(out[name], **{field: value})
    return out


@dataclass(frozen=True, slots=True)
class LoaderPlan:
    """Every setting of one loader, resolved: what its parts are built from.

    Attributes:
        spec: What each decode makes (shape, transform, hook, limits, the cache).
        workers: Decode workers (threads, processes, or the GPU pool's host threads).
        backend: ``"thread"``, ``"process"`` or ``"cuda"``.
        fetch: The fetch config, ``max_inflight`` resolved.
        run: Batch composition, shard and error policy.
        cache: How the SSD cache is kept.
        engine: Ring, limits and event loop.
        slots: Ring slots.
        window: Most samples between the start of their fetch and the end of their decode.
        budget: The CPUs the decode worker default was made from, and the node's ranks.
    """

    spec: DecodeSpec
    workers: int
    backend: Literal["thread", "process", "cuda"]
    fetch: FetchConfig
    run: RunConfig
    cache: CacheConfig
    engine: EngineConfig
    slots: int
    window: int
    budget: CpuBudget


def plan(
    *,
    run: RunConfig,
    transform: Transform | None,
    decode: DecodeFn | None,
    sample_shape: tuple[int, int, int] | None,
    workers: int | None,
    backend: DecodeBackend,
    max_inflight: int | None,
    fetch: FetchConfig | None,
    cache: CacheConfig,
    engine: EngineConfig,
    object_cache: ObjectCache | None,
    device: str | None,
) -> LoaderPlan:
    """Resolve a loader's options (every default from ``_base/_config.py``).

    Raises:
        ValueError: options that contradict each other, or a backend this machine lacks.
    """
    budget = cpu_budget(run.local_world_size)  # the cgroup files read once
    n = decode_worker_count(workers, run.num_workers, budget=budget)
    if decode is None:
        transform = transform or RandomResizedCrop(224)
        h, w = transform.output_size
        shape = (3, h, w)
        if sample_shape is not None and tuple(sample_shape) != shape:
            raise ValueError(
                f"sample_shape={tuple(sample_shape)} but images come out as {shape} "
                f"(transform={transform!r}): the transform sets the size of decoded "
                "images; sample_shape= is for decode= hooks"
            )
    else:
        if sample_shape is None:
            raise ValueError("decode= needs sample_shape=(C, H, W)")
        shape = sample_shape
    if backend not in ("auto", "thread", "process", "cuda"):
        raise ValueError(
            f"decode_backend must be 'auto', 'thread', 'process' or 'cuda', not {backend!r}"
        )
    if backend == "cuda":
        _check_gpu_decode(device, decode)
    elif backend == "auto":
        backend = choose_backend(cache=object_cache is not None, decode_hook=decode is not None)
    elif backend == "process" and os.name != "posix":
        raise ValueError("decode_backend='process' needs a POSIX system: use 'thread'")
    if cache.scaled_jpegs and (object_cache is None or decode is not None):
        raise ValueError(
            "CacheConfig(scaled_jpegs=True) needs a cache_dir and the built-in decode "
            "(no decode= hook)"
        )
    base = fetch or FetchConfig()
    if max_inflight is not None:
        base = dataclasses.replace(base, max_inflight=max_inflight)
    fetch = base.for_workers(n)
    # Hits of large JPEGs are decoded from their scaled copies wherever the cache has them
    # (made by cache_scaled_jpegs or by `asyncloader warm --scaled-jpegs`): same pixels.
    spec = DecodeSpec(
        shape,
        transform,
        decode,
        engine.max_pixels,
        object_cache,
        scaled_copies=object_cache is not None and decode is None,
    )
    return LoaderPlan(
        spec=spec,
        workers=n,
        backend=backend,
        fetch=fetch,
        run=run,
        cache=cache,
        engine=engine,
        slots=ring_slots(engine.prefetch_batches, fetch.inflight, run.batch_size),
        window=decode_window(fetch.inflight, n),
        budget=budget,
    )


def open_cache(cache_dir: str | os.PathLike[str] | None, config: CacheConfig) -> ObjectCache | None:
    """The SSD cache of ``cache_dir`` (None without one), its folder made (its owner's only,
    or its group's) before anything is written there."""
    if not cache_dir:
        return None
    cache = ObjectCache(cache_dir, size_limit=config.size, group_shared=config.group_shared)
    cache.make_folder()
    return cache


def open_the_store(
    url: str | Source | Sequence[str | Source],
    store: ObjectStore | None,
    labels: object,
    options: dict[str, Any] | None,
    run: RunConfig,
) -> tuple[ObjectStore, dict[str, Any], tuple[Source, ...] | None]:
    """A loader's store: ``store`` as given, the store of one URL, or several sources' as
    one (:func:`~asyncloader._stores.open_sources`); the options engine processes open it
    with (several sources: the loader's, for those without their own), and the sources
    (None for one).

    Raises:
        ValueError: as :func:`~asyncloader._stores.open_store`; bad sources, or several
            with a node-local shuffle (``run``).
    """
    sources = as_sources(url, labels, options) if store is None else None  # type: ignore[arg-type]
    if sources:
        if run.shuffle == "node":
            raise ValueError("shuffle='node' reads one source: several are shuffled globally")
        return open_sources(sources), dict(options or {}), sources
    one = cast(str, url)
    opts = store_options(one, labels, options)
    return (store if store is not None else open_store(one, **opts)), opts, None


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
    """The batch buffers: on the GPU for GPU decode, in shared memory for decode processes,
    else in this process; ``attach``: the ring the trainer made for this engine process."""
    shape, b = p.spec.sample_shape, p.run.batch_size
    if attach is not None:  # its arena, if any, is untracked too: the trainer cleans up
        return BatchRing(p.slots, b, shape, shared=True, attach=attach, tracked=False)
    if p.backend == "cuda":
        assert device is not None
        return DeviceBatchRing(p.slots, b, shape, device=device)
    return BatchRing(p.slots, b, shape, shared=p.backend == "process")


def engine_ring(p: LoaderPlan) -> BatchRing:
    """The ring of an engine process of plan ``p`` (its share of the loader's), made by the
    trainer, which hands out its batches; the engine and its decode workers map it."""
    return BatchRing(p.slots, p.run.batch_size, p.spec.sample_shape, shared=True)


def split_plan(p: LoaderPlan, n: int) -> list[LoaderPlan]:
    """``p`` for each of ``n`` engine processes: each makes every n-th batch with its share
    of the decode workers, of the requests in flight and of the ring's slots.  One engine
    gets the loader's ring; of several, each gets its work in flight plus 2 (one ahead, one
    held by the trainer: consecutive batches come from different engines), at least 3."""
    plans = []
    for k in range(n):
        workers = max(1, p.workers // n + (k < p.workers % n))
        inflight = max(1, p.fetch.inflight // n + (k < p.fetch.inflight % n))
        fetch = dataclasses.replace(p.fetch, max_inflight=inflight)
        given = p.engine.prefetch_batches
        slots = max(2, -(-given // n)) if given else ring_slots(None, inflight, p.run.batch_size)
        plans.append(
            dataclasses.replace(
                p,
                workers=workers,
                fetch=fetch,
                slots=slots,
                window=decode_window(inflight, workers),
            )
        )
    return plans


def engine_placement(
    p: LoaderPlan, *, store_given: bool, in_worker: bool | None = None
) -> tuple[int, str | None]:
    """How many engine processes the loader of ``p`` runs (0: inline, in this process),
    and why not where the default could not be followed (for the one warning)."""
    if p.engine.mode == "inline" or p.backend == "cuda" or store_given:
        return 0, None
    if in_worker is None:
        in_worker = multiprocessing.current_process().daemon
    if in_worker:
        return 0, None  # a DataLoader worker: a process of its own already
    if os.name != "posix" or (not USE_MEMFD and not _dev_shm_writable()):
        return 0, "engine processes need shared memory (a memfd, or /dev/shm), not here"
    return engine_processes(p.engine.processes, p.workers), None


def _dev_shm_writable() -> bool:
    return not sys.platform.startswith("linux") or (
        os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
    )


async def make_pool(p: LoaderPlan, ring: BatchRing) -> DecodePool:
    """The decode workers of ``p.backend``, writing into ``ring``."""
    if p.backend == "process":
        from .._decode import ProcessDecodePool

        assert ring.ref is not None
        pool = ProcessDecodePool(
            p.workers, p.spec, ring.ref, ring.images.shape, tracked=ring.tracked
        )
        await pool.start()
        return pool
    if p.backend == "cuda":
        from .._decode._gpu import GpuDecodePool

        return GpuDecodePool(p.workers, p.spec, ring.images)  # type: ignore[arg-type]
    from .._decode import ThreadDecodePool

    return ThreadDecodePool(p.workers, p.spec, ring.images)


def make_pipeline(
    p: LoaderPlan,
    listing: Listing,
    fetcher: Fetcher,
    pool: DecodePool,
    ring: BatchRing,
    counters: Counters,
    output: queue.Queue[Notice],
    cache: ObjectCache | None,
    *,
    part: tuple[int, int] = (0, 1),
) -> Pipeline:
    """The pipeline of one loader over its parts (``cache``: the one the plan was made
    with; ``part``: an engine process's share of the batches), with its cache-fill stage."""
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
    )


def _check_gpu_decode(device: str | None, decode: DecodeFn | None) -> None:
    """``decode_backend="cuda"``'s needs, checked before any work starts."""
    if decode is not None:
        raise ValueError("decode_backend='cuda' decodes JPEGs itself: it takes no decode= hook")
    if device is None or not device.startswith("cuda"):
        raise ValueError(
            f"decode_backend='cuda' decodes into the GPU's memory: it needs device='cuda' "
            f"(or 'cuda:N'), not device={device!r}"
        )
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "decode_backend='cuda' needs a CUDA device, and torch.cuda.is_available() is "
            "False here: use decode_backend='auto'"
        )
    from .._decode._gpu import require_torchvision

    require_torchvision()


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop maker ``event_loop=`` names."""
    if name == "asyncio":
        return asyncio.new_event_loop
    if name != "uvloop":
        raise ValueError(f"event_loop must be 'asyncio' or 'uvloop', not {name!r}")
    try:
        import uvloop
    except ImportError as exc:
        raise ImportError(
            "event_loop='uvloop' needs uvloop: pip install 'asyncloader[uvloop]'"
        ) from exc
    return uvloop.new_event_loop  # type: ignore[no-any-return]
