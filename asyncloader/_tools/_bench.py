"""``bench``: measure the user's own bucket from the machine they will train on, name the
bound and say what to set.

In under a minute by default, against a seeded sample of the objects under the URL:

1. **Latency**: first-byte latency percentiles (1-byte ranged GETs, a few in flight).
2. **Fetch**: whole-object GETs/s, MB/s and client CPU per GET at 1, 2, 4, ... requests in
   flight (throttling answers counted per level), and the CPU per GET of the processes
   that answered where they run on this machine (a local emulator, a proxy on the node).
3. **Decode**: CPU per image of decode + transform (the loader's own code, the default
   ``RandomResizedCrop``), and images/s of the decode workers together.
4. **Disk**: the cache folder's write rate and its read rate with the page cache dropped
   (a scratch cache inside it, removed after).

The model: the loader runs at the slower of what the store delivers at the recommended
requests in flight and what the CPUs decode once the event loop's share (client CPU per
GET, and the loader's own work per image) is taken out of them.  Later epochs from the
cache run at the slower of decode and the disk.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import statistics
import time
from collections.abc import Sequence
from typing import Any

from .._base._config import CacheConfig, decode_worker_count, engine_processes
from .._base._env import cpu_budget
from .._base._errors import AsyncLoaderError, StoreError, Throttled, shown_key
from .._base._own_thread import run_here
from .._base._proctree import machine_busy_seconds, own_cpu_seconds, peer_processes
from .._base._types import Blob, ObjectInfo, ObjectStore
from .._cache import ObjectCache
from .._dataset import saved_listing
from .._dataset._labels import IMAGE_EXTENSIONS, no_samples
from .._dataset._saved import listing_path, save_listing
from .._decode import decode_holds_gil
from .._stores import open_store
from .._stores._retry import retrying
from ._bench_local import MAX_SAMPLE_BYTES, decodable, decode_rates, disk_rates
from ._bench_report import BenchReport, FetchLevel

__all__ = ["bench"]

LOADER_CPU_MS_PER_IMAGE = 0.2
"""The loader's own CPU per image besides the GET and the decode (scheduling, the ring,
batch bookkeeping, threads taking turns at the GIL), measured on the development machine:
2 cores, ~110 KB JPEGs (``benchmarks/bench_predict.py``)."""
_HEADROOM = 1.3  # the store should deliver this much more than decode absorbs


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    v = sorted(values)

    def at(q: float) -> float:
        return v[min(len(v) - 1, int(q * len(v)))]

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": v[-1]}


async def _listed(
    store: ObjectStore, cache: ObjectCache | None, seconds: float, enough: int
) -> tuple[Sequence[ObjectInfo], bool]:
    """The saved listing when there is one; else as much of the listing as ``seconds``
    allow (sorted key order) once it holds ``enough`` images (the sample), or any image
    after ten times that (a store that lists slowly, a machine under load: a listing cut
    before its first image, ``.complete.json`` sorted first, would say "no images" of a
    folder full of them); and whether it is complete."""
    folder = cache.directory if cache is not None else None
    saved = await saved_listing(store, folder, CacheConfig().max_age)
    if saved is not None:
        return saved, True
    out: list[ObjectInfo] = []
    images = 0
    start = time.perf_counter()
    listing = store.list()
    try:
        async for info in listing:
            out.append(info)
            images += _is_image(info.key)
            spent = time.perf_counter() - start
            if (spent > seconds and images >= enough) or (spent > 10 * seconds and images):
                return out, False
    finally:
        await listing.aclose()  # type: ignore[attr-defined]
    if folder is not None:
        path = listing_path(folder, store.url)
        await asyncio.to_thread(save_listing, path, store.url, out)
    return out, True


def _is_image(key: str) -> bool:
    return os.path.splitext(key)[1].lower() in IMAGE_EXTENSIONS


async def _get(store: ObjectStore, info: ObjectInfo, throttled: list[int], **kw: Any) -> Blob:
    def count(exc: StoreError) -> None:
        if isinstance(exc, Throttled):
            throttled[0] += 1

    return await retrying(lambda: store.get(info.key, etag=info.etag, **kw), on_retry=count)


async def _background(seconds: float) -> float:
    """The CPUs the rest of the machine keeps busy while this process waits [cores]."""
    busy0, cpu0, t0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    other = machine_busy_seconds() - busy0 - (time.process_time() - cpu0)
    return max(0.0, other / (time.perf_counter() - t0))


async def _run_level(
    store: ObjectStore,
    sample: Sequence[ObjectInfo],
    inflight: int,
    seconds: float,
    background: float = 0.0,
    **kw: Any,
) -> tuple[int, int, list[float], float, float, int, float]:
    """``inflight`` workers GET sample objects round robin for ``seconds``: (GETs, bytes,
    latencies [ms], CPU seconds of this process and of the processes that answered where
    they run here (where one cannot be named: of the rest of the machine beyond its
    ``background`` [cores]), throttling answers, wall seconds until the last answer)."""
    latencies: list[float] = []
    done = [0, 0]
    throttled = [0]
    each0 = own_cpu_seconds()
    t_start = time.perf_counter()
    deadline = t_start + seconds
    cpu0 = time.process_time()
    busy0 = machine_busy_seconds()

    async def worker(i: int) -> None:
        j = i
        while time.perf_counter() < deadline:
            info = sample[j % len(sample)]
            j += inflight
            t0 = time.perf_counter()
            body = await _get(store, info, throttled, **kw)
            latencies.append((time.perf_counter() - t0) * 1e3)
            done[0] += 1
            done[1] += len(body)

    await asyncio.gather(*(worker(i) for i in range(inflight)))
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu0
    other = machine_busy_seconds() - busy0 - cpu - background * wall
    other = max(0.0, other) if busy0 else 0.0
    peers = peer_processes()
    if peers is not None:
        # The processes that answered, where they run here: a neighbour that starts meanwhile
        # (a training job, another test) is not the store's CPU, and a remote store costs
        # this machine nothing.  The machine's busy time beyond its background otherwise.
        each1 = own_cpu_seconds()
        other = sum(max(0.0, each1.get(p, 0.0) - each0.get(p, 0.0)) for p in peers)
    return done[0], done[1], latencies, cpu, other, throttled[0], wall


def _levels(most: int) -> list[int]:
    out, n = [], 1
    while n <= most:
        out.append(n)
        n *= 2
    if out[-1] != most:
        out.append(most)
    return out


async def _measure(
    url: str,
    store_options: dict[str, Any],
    cache_dir: str | None,
    seconds: float,
    sample_size: int,
    max_inflight: int,
    seed: int,
) -> dict[str, Any]:
    store = open_store(url, **store_options)
    cache = ObjectCache.opened(cache_dir, CacheConfig())  # the loader's cache, as it opens it
    try:
        objects, complete = await _listed(store, cache, seconds * 0.2, sample_size)
        images = [o for o in objects if _is_image(o.key)]
        if not images:
            raise AsyncLoaderError(no_samples(url, len(objects), IMAGE_EXTENSIONS))
        rng = random.Random(seed)
        sample = rng.sample(images, min(sample_size, len(images)))
        budget, kept = 0, list[ObjectInfo]()
        for o in sample:
            if budget + o.size > MAX_SAMPLE_BYTES and kept:
                break
            kept.append(o)
            budget += o.size
        sample = kept
        # The sample's bytes (for decode and disk), 32 in flight.
        sem = asyncio.Semaphore(32)
        throttled = [0]

        async def fetch(info: ObjectInfo) -> tuple[str, Blob]:
            async with sem:
                return info.key, await _get(store, info, throttled)

        bodies = await asyncio.gather(*(fetch(o) for o in sample))
        # First-byte latency: 1-byte ranged GETs, 4 in flight.
        first_bytes = (await _run_level(store, sample, 4, seconds * 0.1, start=0, end=1))[2]
        levels = _levels(max_inflight)
        per_level = seconds * 0.35 / len(levels)
        fetch_levels = []
        for n in levels:
            # The rest of the machine's own load, just before each level, for where the
            # answering processes cannot be named (see _run_level).
            background = await _background(min(0.25, per_level / 4))
            gets, nbytes, lat, cpu, other, thr, wall = await _run_level(
                store, sample, n, per_level, background
            )
            fetch_levels.append(
                FetchLevel(
                    inflight=n,
                    gets_per_second=gets / wall,
                    mb_per_second=nbytes / wall / 1e6,
                    client_cpu_ms_per_get=cpu / max(gets, 1) * 1e3,
                    other_cpu_ms_per_get=other / max(gets, 1) * 1e3,
                    p50_ms=_percentiles(lat)["p50"],
                    p99_ms=_percentiles(lat)["p99"],
                    throttled=thr,
                )
            )
        return {
            "objects": objects,
            "complete": complete,
            "sample": sample,
            "bodies": bodies,
            "first_bytes": first_bytes,
            "levels": fetch_levels,
        }
    finally:
        await store.close()
        if cache is not None:
            cache.close()


def bench(
    url: str,
    *,
    seconds: float = 45.0,
    sample: int = 256,
    max_inflight: int = 256,
    decode_workers: int | None = None,
    size: int = 224,
    cache_dir: str | os.PathLike[str] | None = None,
    store_options: dict[str, Any] | None = None,
    seed: int = 0,
) -> BenchReport:
    """Measure ``url`` from this machine and recommend loader settings (see the module
    text for what is measured and the model).  Blocking.

    Args:
        seconds: The time budget of the measurements, roughly.
        sample: Objects sampled (seeded) for fetch, decode and disk.
        max_inflight: The most requests in flight tried.
        decode_workers: Decode workers to plan for (default: the usable CPUs, as the loader).
        size: The output size of the ``RandomResizedCrop`` decoded.
        cache_dir: The cache folder to measure (and read a saved listing from); None: no
            disk measurement.

    Raises:
        AsyncLoaderError: no images there (the message says where to look).
        StoreError: the store could not be listed or read.
    """
    t_start = time.perf_counter()
    budget = cpu_budget()
    cpus = budget.cpus
    workers = decode_worker_count(decode_workers, budget=budget)  # the loader's default
    directory = str(cache_dir) if cache_dir is not None else None
    m = run_here(
        _measure(url, dict(store_options or {}), directory, seconds, sample, max_inflight, seed)
    )
    objects: list[ObjectInfo] = m["objects"]
    bodies: list[tuple[str, Blob]] = m["bodies"]
    levels: list[FetchLevel] = m["levels"]
    good, undecodable = decodable(bodies, size)
    per_image, decode_rate = decode_rates(good, workers, seconds * 0.25, size)
    d_ms = per_image * 1e3
    disk = disk_rates(directory, bodies, workers) if directory else None

    # From the store: decode shares the CPUs with the event loop's GETs and bookkeeping.
    def cpu_rate(extra_ms: float) -> float:
        return decode_rate * d_ms / (d_ms + extra_ms)

    enough = [lv for lv in levels if lv.gets_per_second >= _HEADROOM * cpu_rate(0.1)]
    if enough:
        chosen = min(enough, key=lambda lv: lv.inflight)
        recommended = min(2 * chosen.inflight, max(lv.inflight for lv in levels))
    else:
        chosen = max(levels, key=lambda lv: lv.gets_per_second)
        recommended = chosen.inflight
    at = next(lv for lv in levels if lv.inflight == recommended)
    # What the rest of the machine spends per GET (a local emulator): the least of the
    # levels, where the most GETs share whatever else ran meanwhile.
    other = min(lv.other_cpu_ms_per_get for lv in levels)
    per_get = at.client_cpu_ms_per_get + other
    store_cpu = cpu_rate(per_get + LOADER_CPU_MS_PER_IMAGE)
    fetch_rate = max(at.gets_per_second, chosen.gets_per_second)
    predicted = min(store_cpu, fetch_rate)
    bound = "decode" if store_cpu <= fetch_rate else "fetch"
    lat = [x for x in m["first_bytes"]]
    pct = _percentiles(lat)
    mean_bytes = statistics.fmean(len(b) for _, b in bodies)
    reasons = []
    if bound == "decode":
        reasons.append(
            f"the CPUs decode {store_cpu:.0f} images/s while the store delivers "
            f"{fetch_rate:.0f} objects/s at {recommended} requests in flight: more requests "
            "in flight would not help; more cores (or smaller images) would"
        )
    else:
        reasons.append(
            f"the store delivers {fetch_rate:.0f} objects/s at best ({chosen.inflight} in "
            f"flight, p50 latency {pct['p50']:.0f} ms) while the CPUs could decode "
            f"{store_cpu:.0f} images/s: the cache pays from the second epoch on"
        )
    if any(lv.throttled for lv in levels):
        first = min(lv.inflight for lv in levels if lv.throttled)
        reasons.append(f"the store throttled from {first} requests in flight on")
    cached = cached_bound = None
    fits = True
    listed_bytes = sum(o.size for o in objects)
    if disk is not None:
        assert directory is not None
        disk_rate = float(disk["read_objects_per_second"])
        from_cache = cpu_rate(LOADER_CPU_MS_PER_IMAGE)
        cached = min(from_cache, disk_rate)
        cached_bound = "decode" if from_cache <= disk_rate else "disk"
        free = shutil.disk_usage(directory).free
        fits = m["complete"] and listed_bytes <= 0.9 * free
        if not fits:
            reasons.append(
                "the data does not fit the cache disk (or was not listed whole): the cache "
                "would keep a fixed share of it"
            )
    use_cache = cached is not None and cached > 1.15 * predicted
    if cached is not None and not use_cache:
        reasons.append(
            "a cache would not speed this machine up (it still saves requests and rides out "
            "latency spikes)"
        )
    settings: dict[str, Any] = {
        "max_inflight": recommended,
        "decode_workers": workers,
        # The engine processes a loader of these settings runs by default (the one rule).
        "engine_processes": engine_processes(
            None, workers, holds_gil=decode_holds_gil(decode_hook=False)
        ),
        "cache": use_cache,
        "cache_dir": directory if use_cache else None,
    }
    return BenchReport(
        url=shown_key(url),  # a credential in it (user info, a query) hidden
        cpus=cpus,
        cpu_budget=budget.describe(),
        objects_listed=len(objects),
        listing_complete=bool(m["complete"]),
        listed_bytes=listed_bytes,
        sample_objects=len(bodies),
        mean_object_bytes=mean_bytes,
        latency_ms=pct,
        fetch=levels,
        decode_cpu_ms_per_image=d_ms,
        decode_images_per_second_per_core=1e3 / d_ms if d_ms else 0.0,
        decode_images_per_second=decode_rate,
        disk=disk,
        predicted_images_per_second=predicted,
        bound=bound,
        cached_images_per_second=cached,
        cached_bound=cached_bound,
        settings=settings,
        reasons=reasons,
        undecodable=undecodable,
        latencies_ms=lat,
        seconds=time.perf_counter() - t_start,
    )
