"""``warm``: fill the SSD cache ahead of a run — the fetch path without decode.

Objects already cached are skipped after a quick index check, so an interrupted warm resumes
where it stopped.  Fetched bytes are verified (length, ETag) like any other fetch and written
by the cache's writer thread (appended to a pack file, indexed 32 at a time; the event loop
never waits on the disk).  ``shard=(i, n)`` warms every n-th object of the
sorted listing, so the nodes of a cluster can each warm their part.  With
``scaled_jpegs``, large JPEGs also get their scaled copies (see
:func:`~asyncloader._decode._image.scaled_copies`), made on every core; objects cached
earlier without them get them from the cache, without a fetch.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from .._base._config import (
    CACHE_SIZE,
    LISTING_MAX_AGE,
    CacheConfig,
    FetchConfig,
    RunConfig,
    ShardConfig,
)
from .._base._env import local_world_size, shard_from_env, usable_cpus
from .._base._errors import AsyncLoaderError, shown_key
from .._base._own_thread import run_here
from .._base._sources import Source, as_sources
from .._base._stats import Counters
from .._base._types import Blob, ObjectInfo, ObjectStore, derived_key
from .._cache import ObjectCache
from .._cache._admission import ADMIT_ALL, admitted
from .._dataset import list_objects, metadata_file
from .._dataset._headers import HEAD_BYTES
from .._dataset._imagesize import object_sizes
from .._dataset._labels import IMAGE_EXTENSIONS, KeyFilter
from .._dataset._metadata import metadata_objects, named_not_there, sidecar_objects
from .._dataset._sizes import keep_sizes
from .._decode import SCALED_COPY_MIN, scaled_copies, scaled_name
from .._run._build import make_fetcher
from .._run._cache_fill import CacheFill, entry_key, node_admission, node_objects

__all__ = ["WarmReport", "warm", "warm_cache"]


@dataclass(slots=True)
class WarmReport:
    """What a warm did.

    Attributes:
        listed: Objects in this shard: its images, and their sidecars.
        already_cached: Skipped: present before the warm started.
        warmed: Fetched, verified and written.
        failed: ``(key, error text)`` of every object that could not be warmed (a key that
            is a presigned URL without its query: it is a credential).
        bytes_fetched: Body bytes received [bytes].
        seconds: Wall time of the fetch phase [seconds].
        retries: Retries by reason.
        write_cpu_seconds: CPU time of the thread writing the cache [seconds].
        not_admitted: Left out: the shard does not fit the cache, which keeps a fixed
            subset of it (the one loaders keep; counted in ``listed``).
        scaled: Objects given scaled copies (``scaled_jpegs``), cached before or now.
        sidecars: Of ``listed``, the images' same-stem sidecar files (``x.txt`` and
            ``x.json`` beside ``x.jpg``), warmed with them for a run's ``extras=``.
        missing: The images the metadata files name (shown as ``failed``'s keys) that
            the store's listing does not have, sorted: not warmed, not counted in
            ``listed`` nor ``failed``; a run that reads the files (``extras=``, a labels
            column, ``filters=``) reports each missing when it reads it
            (``ObjectNotFound``).  Every shard reports them all.  A name the listing itself
            has as not there (a manifest's, or a web folder's, listed from its metadata
            file: size -1) is in ``failed``, not asked of the store.
    """

    listed: int = 0
    already_cached: int = 0
    warmed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    bytes_fetched: int = 0
    seconds: float = 0.0
    retries: dict[str, int] = field(default_factory=dict)
    write_cpu_seconds: float = 0.0
    not_admitted: int = 0
    scaled: int = 0
    sidecars: int = 0
    missing: list[str] = field(default_factory=list)

    def add(self, other: WarmReport) -> None:
        """Count ``other`` (another source's warm) in this report."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                setattr(self, f.name, dict(Counter(mine) + Counter(theirs)))
            else:
                setattr(self, f.name, mine + theirs)

    def summary(self) -> str:
        secs = max(self.seconds, 1e-9)
        return (
            f"{self.warmed} objects warmed ({self.bytes_fetched / 1e9:.2f} GB) in "
            f"{self.seconds:.1f} s: {self.warmed / secs:.0f} objects/s, "
            f"{self.bytes_fetched / secs / 1e6:.1f} MB/s; {self.already_cached} already "
            f"cached, {len(self.failed)} failed, retries {sum(self.retries.values())}"
            + (f"; {self.scaled} given scaled copies" if self.scaled else "")
            + (f"; {self.sidecars} of the objects are sidecars" if self.sidecars else "")
            + (
                f"; {len(self.missing)} named by the metadata files but not in the store "
                "(missing when a run reads them)"
                if self.missing
                else ""
            )
            + (
                f"; {self.not_admitted} left out: the data does not fit the cache, which "
                "keeps a fixed subset"
                if self.not_admitted
                else ""
            )
        )


async def warm_cache(
    store: ObjectStore,
    cache: ObjectCache,
    *,
    max_inflight: int | None = None,
    shard: tuple[int, int] = (0, 1),
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    listing_max_age: float = LISTING_MAX_AGE,
    on_listed: Callable[[int, int], None] | None = None,
    on_object: Callable[[int], None] | None = None,
    node_seed: int | None = None,
    scaled_jpegs: bool = False,
) -> WarmReport:
    """Fetch every object of ``shard`` not yet in ``cache`` and store it.

    Args:
        store: Where the objects are.
        cache: Where they go.
        max_inflight: Requests in flight (default: 64 per usable CPU, at least 64; see
            :func:`~asyncloader._base._config.default_max_inflight`).
        shard: ``(i, n)``: warm objects ``i, i+n, ...`` of the sorted listing; with
            ``node_seed``, node ``i`` of ``n``'s subset under ``shuffle="node"`` and that
            seed (exactly what that node's loaders will read).
        extensions: Warm only keys with these endings (None: every object).
        listing_max_age: Reuse a saved listing younger than this [seconds].
        on_listed: Called with (objects to warm, already cached) once known.
        on_object: Called with the byte count of each object warmed (progress).
        scaled_jpegs: Also store the scaled copies of JPEGs of at least 1 MiB (those
            already cached without them too), made by a thread per usable CPU.

    Raises:
        AsyncLoaderError: an impossible shard.
    """
    i, n = shard
    if n < 1 or not 0 <= i < n:
        raise AsyncLoaderError(f"shard {i}/{n} does not exist: use i/n with 0 <= i < n")
    # Its owner's only (or its group's), before anything is written.
    new_folder = await asyncio.to_thread(_make_folder, cache)
    try:
        objects = await list_objects(store, cache.directory, listing_max_age)
    except BaseException:
        if new_folder:  # a wrong bucket or URL leaves no folder behind: nothing was written
            await asyncio.to_thread(shutil.rmtree, cache.directory, True)
        raise
    counters = Counters()
    # The metadata files (captions, columns: the root's and its folders'), kept beside the
    # listing as a loader keeps them: a run with extras= then starts from the node's disk,
    # the store unreachable.
    failed: list[tuple[str, str]] = []
    files: list[tuple[str, bytes]] = []
    for meta in metadata_objects(objects):
        try:
            files.append((meta.key, await metadata_file(store, cache.directory, meta, counters)))
        except AsyncLoaderError as exc:
            failed.append((shown_key(meta.key), str(exc).splitlines()[0]))
    wanted = KeyFilter(extensions)
    # The images the files name that the store's listing does not have: nothing to warm,
    # and what a run that reads the files will report missing, said now.  (A name the
    # listing has with size -1 — a manifest's, a web folder's listed from its metadata
    # file — is the listing's own: it fails below as any object that cannot be warmed.)
    named, unreadable = await asyncio.to_thread(named_not_there, files, objects, wanted)
    failed += [(shown_key(key), error) for key, error in unreadable]
    listed = {o.key for o in objects}
    missing = [shown_key(key) for key in named if key not in listed]
    ordered = sorted((o for o in objects if wanted(o.key)), key=lambda o: o.key)
    # Node i of n, as its loaders read: rank i of n in listing order, or node i of n's
    # subset under shuffle="node" with that seed.
    node = RunConfig(
        batch_size=1,
        shuffle="node" if node_seed is not None else False,
        seed=node_seed or 0,
        rank=i,
        world_size=n,
        shard=ShardConfig(local_world_size=1),
    )
    mine = list(node_objects(ordered, node))
    # A cache too small for this shard keeps a fixed subset: the loader's, by its one rule.
    threshold, _ = await asyncio.to_thread(
        node_admission, ordered, node, cache.size_limit, scaled=scaled_jpegs
    )
    report = WarmReport(listed=len(mine), failed=failed, missing=missing)
    if threshold < ADMIT_ALL:
        kept = [o for o in mine if admitted(o.key, threshold)]
        report.not_admitted = len(mine) - len(kept)
        mine = kept
    # Each image's sidecars (x.txt beside x.jpg), as a loader with extras=("txt",) fetches
    # them beside it: the run then reads them from the node's disk too.
    sidecars = sidecar_objects(objects, mine, wanted)
    report.sidecars = len(sidecars)
    report.listed += len(sidecars)
    mine += sidecars
    keys = {o.key: entry_key(store, o.key, o.etag) for o in mine}
    fetcher = make_fetcher(store, counters, FetchConfig(max_inflight=max_inflight), cache.directory)
    refreshed: set[str] = set()  # objects read from the cache for their copies (added first)
    sizes: dict[tuple[str, str], tuple[int, int]] = {}  # each image's, for buckets
    upright: dict[tuple[str, str], tuple[int, int]] = {}  # the same, upright (EXIF)

    def written(objs: list[str], error: Exception | None) -> None:  # on the writer thread
        if error is None:
            # only this thread writes it; objects read from the cache were there already
            report.warmed += sum(k not in refreshed for k in objs)
        else:
            report.failed.extend((shown_key(k), f"cache write failed: {error}") for k in objs)

    made: list[int] = []  # one item per object given copies (appends are atomic)

    def derive(data: Blob) -> list[tuple[str, bytes]]:  # on a derive thread
        copies = scaled_copies(data)
        if copies:
            made.append(1)
        return copies

    # The same way into the cache as the loader's (index thread, writer, fetch once), except
    # that fetches wait while the writer is full: filling the cache is the job here.
    fill = CacheFill(
        cache,
        fetcher,
        counters,
        admit=lambda key: True,  # `mine` holds the admitted objects only
        done=written,
        name="asyncloader-warm-index",
        derive=derive if scaled_jpegs else None,
        derive_threads=usable_cpus(),
        wait_for_room=True,
    )
    in_index = fill.index.run
    try:
        present = await in_index(cache.contains, keys.values())
        todo = [o for o in mine if keys[o.key] not in present]
        report.already_cached = len(mine) - len(todo)
        # Cached before, large, and without the copy every image that has copies has (1/8).
        later: list[ObjectInfo] = []
        if scaled_jpegs:
            large = [o for o in mine if keys[o.key] in present and o.size >= SCALED_COPY_MIN]
            copied = {o.key: derived_key(keys[o.key], scaled_name(8)) for o in large}
            have = await in_index(cache.contains, copied.values())
            later = [o for o in large if copied[o.key] not in have]
        again = {o.key for o in later}
        if on_listed is not None:
            on_listed(len(todo) + len(later), report.already_cached)
        pending = iter([*later, *todo])
        t0 = time.perf_counter()

        async def worker() -> None:
            for obj in pending:  # shared iterator: each object goes to one worker
                data: Blob | None = None
                if obj.key in again:  # cached already: only its copies are made
                    data = await in_index(cache.get, keys[obj.key], obj.size)
                if data is not None:  # else gone meanwhile (evicted, damaged): fetched
                    refreshed.add(obj.key)
                    await fill.once.store(obj.key, keys[obj.key], data, stored=True)
                else:
                    try:
                        data = await fill.once.fetch(obj, keys[obj.key])
                    except AsyncLoaderError as exc:
                        report.failed.append((shown_key(obj.key), str(exc).splitlines()[0]))
                        continue
                # Its size, from the header in hand: a bucketed run reads no header again
                # (as stored, and upright by its EXIF orientation for exif_orientation=True).
                if (both := object_sizes(data, HEAD_BYTES)) is not None:
                    sizes[(obj.key, obj.etag)], upright[(obj.key, obj.etag)] = both
                if on_object is not None:
                    on_object(len(data))

        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(min(fetcher.config.inflight, max(len(todo), 1))):
                    tg.create_task(worker())
        finally:
            fetcher.close()
            await asyncio.to_thread(fill.writer.close)
            report.write_cpu_seconds = fill.writer.cpu_seconds
            report.scaled = len(made)
        report.seconds = time.perf_counter() - t0
        await keep_sizes(store.url, cache.directory, sizes)
        await keep_sizes(store.url, cache.directory, upright, upright=True)
        report.bytes_fetched = counters.bytes_fetched
        report.retries = dict(counters.retries)
        return report
    finally:
        await asyncio.to_thread(fill.close)


def warm(
    url: str | Source | Sequence[str | Source],
    cache_dir: str | os.PathLike[str],
    *,
    cache_size: int | str = CACHE_SIZE,
    max_inflight: int | None = None,
    shard: tuple[int, int] | None = None,
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    refresh_listing: bool = False,
    store_options: dict[str, object] | None = None,
    on_listed: Callable[[int, int], None] | None = None,
    on_object: Callable[[int], None] | None = None,
    node_seed: int | None = None,
    scaled_jpegs: bool = False,
    group_shared: bool = False,
) -> WarmReport:
    """Fill ``cache_dir`` with the objects under ``url`` (see :func:`warm_cache`).

    A missing ``cache_dir`` is made readable by its owner only, or with ``group_shared``
    by the owner's group too (see :class:`~asyncloader.ObjectCache`).

    ``shard`` defaults to the torchrun environment: ``RANK``/``WORLD_SIZE``, or with
    ``node_seed`` (warming for ``shuffle="node"``) this node of ``WORLD_SIZE //
    LOCAL_WORLD_SIZE``; else all.  Blocking; runs its own event loop.

    Several sources (a list, as a loader mixes them): each warmed in turn, with its own
    ``store_options`` where it has them, into one report; a loader of the mix then reads
    every object from the cache.
    """
    if not isinstance(url, str):
        report = WarmReport()
        for source in as_sources(url, store_options=store_options) or ():
            report.add(
                warm(
                    source.url,
                    cache_dir,
                    cache_size=cache_size,
                    max_inflight=max_inflight,
                    shard=shard,
                    extensions=extensions,
                    refresh_listing=refresh_listing,
                    store_options=source.store_options,
                    on_listed=on_listed,
                    on_object=on_object,
                    node_seed=node_seed,
                    scaled_jpegs=scaled_jpegs,
                    group_shared=group_shared,
                )
            )
        return report
    if shard is None:
        rank, world = shard_from_env()
        if node_seed is not None:
            local = local_world_size() or world
            shard = (rank // local, max(world // local, 1))
        else:
            shard = (rank, world)
    from .._stores import open_store

    config = CacheConfig(
        size=cache_size, refresh_listing=refresh_listing, group_shared=group_shared
    )

    async def main() -> WarmReport:
        store = open_store(url, **(store_options or {}))
        try:
            # Its folder is made once the store has listed: a failed warm writes nothing.
            cache = ObjectCache.opened(cache_dir, config, make=False)
            assert cache is not None
            return await warm_cache(
                store,
                cache,
                max_inflight=max_inflight,
                shard=shard,
                extensions=extensions,
                listing_max_age=config.max_age,
                on_listed=on_listed,
                on_object=on_object,
                node_seed=node_seed,
                scaled_jpegs=scaled_jpegs,
            )
        finally:
            await store.close()

    return run_here(main())  # its threads ended when it returns: a fork after is safe


def _make_folder(cache: ObjectCache) -> bool:
    """Make the cache's folder; whether it was missing (made here)."""
    missing = not os.path.isdir(cache.directory)
    cache.make_folder()
    return missing
