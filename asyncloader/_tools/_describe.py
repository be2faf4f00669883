"""``describe``: what is under a URL — objects, bytes, classes, sizes, extensions, the
metadata files and what they hold — from the listing the cache saved when there is one
(``asyncloader ls``)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import posixpath
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from .._base._config import CACHE_SIZE, LISTING_MAX_AGE, CacheConfig
from .._base._errors import shown_key
from .._base._own_thread import run_on_own_thread
from .._base._types import ObjectInfo, ObjectStore
from .._cache import ObjectCache
from .._dataset import list_for, list_objects, saved_listing
from .._dataset._labels import (
    IMAGE_EXTENSIONS,
    KeyFilter,
    columnar_manifest,
    key_path,
    no_samples,
)
from .._dataset._listing import read_metadata_files
from .._dataset._located import write_file
from .._dataset._metadata import metadata_objects, some_names
from .._dataset._objects import ObjectList
from .._stores import open_store
from .._stores import store_options as store_options_for
from ._columns import MetadataReport, metadata_report

__all__ = ["Inventory", "describe", "inventory", "listing"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a URL holds.

    Attributes:
        url: The store's canonical URL.
        objects, bytes: Every object listed, and their total size [bytes]; not a name
            listed as not there (size -1: a web server's folder is listed from its metadata
            file, and the HEAD of a name it did not have found nothing).
        samples, sample_bytes: The objects the loader would read (image extensions, unless
            every object was asked for), and their size [bytes].
        classes: ImageFolder classes (the samples' parent folders) → sample count, sorted.
        size_percentiles: p50, p90, p99 and max of the samples' sizes [bytes].
        extensions: Extension (lower case, ``""`` for none) → objects, most common first.
        from_saved_listing: The listing came from the cache, not from the store.
        metadata_files: The metadata files a loader reads for ``extras=``, a labels column
            or ``filters=`` (the root's and its folders': Hugging Face's ``imagefolder``),
            by key.
        metadata: What they hold, read as a loader reads them (:class:`MetadataReport`:
            rows, columns, the images they name that are not there and those they do not
            name); None where there are none, or they were not asked to be read.
    """

    url: str
    objects: int
    bytes: int
    samples: int
    sample_bytes: int
    classes: dict[str, int] = field(default_factory=dict)
    size_percentiles: dict[str, int] = field(default_factory=dict)
    extensions: dict[str, int] = field(default_factory=dict)
    from_saved_listing: bool = False
    metadata_files: list[str] = field(default_factory=list)
    metadata: MetadataReport | None = None

    def nothing_to_read(self) -> str:
        """Why a loader would find no samples here (for an inventory without any)."""
        return no_samples(self.url, self.objects, IMAGE_EXTENSIONS)

    def summary(self) -> str:
        """A few human lines."""
        p = self.size_percentiles
        lines = [
            f"{self.url}: {self.objects} objects, {self.bytes / 1e9:.3f} GB"
            + (" (saved listing)" if self.from_saved_listing else ""),
            f"samples: {self.samples} ({self.sample_bytes / 1e9:.3f} GB); sizes p50 "
            f"{p.get('p50', 0) / 1e3:.0f} KB, p90 {p.get('p90', 0) / 1e3:.0f} KB, p99 "
            f"{p.get('p99', 0) / 1e3:.0f} KB, max {p.get('max', 0) / 1e3:.0f} KB",
            "extensions: "
            + (", ".join(f"{e or '(none)'} {n}" for e, n in self.extensions.items()) or "none"),
            f"classes: {len(self.classes)}",
        ]
        lines += [f"  {name or '(top level)'}: {n}" for name, n in self.classes.items()]
        if self.metadata_files:
            shown = some_names(self.metadata_files)
            lines.append(
                f"metadata files: {len(self.metadata_files)} ({shown}): they name the samples "
                "and give their columns to extras=, a labels column and filters="
            )
        if self.metadata is not None:
            lines += self.metadata.lines()
        return "\n".join(lines)


def inventory(
    url: str,
    objects: Sequence[ObjectInfo],
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    *,
    from_saved_listing: bool = False,
) -> Inventory:
    """The :class:`Inventory` of a listing (pure)."""
    # The metadata files from the listing as given (an ObjectList passes as it is).
    metadata_files = [o.key for o in metadata_objects(ObjectList.of(objects))]
    objects = [o for o in objects if o.size != -1]
    wanted = KeyFilter(extensions)
    samples = [o for o in objects if wanted(o.key)]
    sizes = sorted(max(o.size, 0) for o in samples)

    def pct(q: float) -> int:
        return sizes[min(int(q * len(sizes)), len(sizes) - 1)] if sizes else 0

    exts: Counter[str] = Counter()
    for o in objects:
        name = posixpath.basename(key_path(o.key))
        exts[os.path.splitext(name)[1].lower()] += 1
    classes = Counter(posixpath.dirname(o.key) for o in samples)
    return Inventory(
        url=url,
        objects=len(objects),
        bytes=sum(max(o.size, 0) for o in objects),
        samples=len(samples),
        sample_bytes=sum(sizes),
        classes=dict(sorted(classes.items())),
        size_percentiles={"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": pct(1.0)},
        extensions=dict(exts.most_common()),
        from_saved_listing=from_saved_listing,
        metadata_files=metadata_files,
    )


async def describe_store(
    store: ObjectStore,
    cache: ObjectCache | None = None,
    *,
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    listing_max_age: float = LISTING_MAX_AGE,
    write_manifest: str | os.PathLike[str] | None = None,
    store_options: dict[str, Any] | None = None,
    metadata: bool = True,
) -> Inventory:
    """The inventory of ``store``: from the cache's saved listing if young enough, else
    listed (and saved when there is a cache); with ``write_manifest``, its samples written
    there as a listing manifest (see :func:`describe`; ``store_options``: how to reach a
    manifest URL outside the store's root); with ``metadata``, what its metadata files
    hold, each read through the cache as a loader reads it (and kept there for one)."""
    folder = cache.directory if cache is not None else None
    saved = await saved_listing(store, folder, listing_max_age)
    objects = saved if saved is not None else await list_objects(store, folder, 0)
    if write_manifest is not None:
        target = os.fspath(write_manifest)
        data = await asyncio.to_thread(manifest_bytes, target, objects, extensions)
        await write_file(store, target, data, store_options)
    inv = inventory(store.url, objects, extensions, from_saved_listing=saved is not None)
    if not metadata or not inv.metadata_files:
        return inv
    listed = ObjectList.of(objects)
    table = await read_metadata_files(store, folder, listed, None)
    if table is None:  # not reached: the inventory found the files
        return inv
    # A web server's folder is listed from its metadata file: a name the server did not
    # have (its HEAD's 404) is listed with size -1, and is not there.
    keys = {o.key for o in objects if o.size != -1}
    keys.difference_update(inv.metadata_files)
    report = await asyncio.to_thread(metadata_report, table, keys, KeyFilter(extensions))
    return replace(inv, metadata=report)


def manifest_bytes(
    name: str, objects: Sequence[ObjectInfo], extensions: Sequence[str] | None
) -> bytes:
    """The samples, sorted by key, as the manifest ``name`` (by its suffix): JSONL rows
    ``{key, label, size, etag}`` (label: the ImageFolder class), or ``.npz`` arrays.

    Raises:
        ValueError: ``name`` is neither.
    """
    suffix = posixpath.splitext(name.partition("?")[0])[1]
    if suffix not in (".jsonl", ".npz"):
        raise ValueError(
            f"write the manifest to a .jsonl file (rows) or a .npz file (arrays, the fastest "
            f"to read), not {shown_key(name)!r}"
        )
    wanted = KeyFilter(extensions)
    rows = sorted((o for o in objects if wanted(o.key)), key=lambda o: o.key)
    if suffix == ".npz":
        labels = [posixpath.dirname(o.key) for o in rows]
        out = io.BytesIO()
        np.savez(out, **columnar_manifest(ObjectList.of(rows), labels))
        return out.getvalue()
    lines = []
    for o in rows:
        row = {"key": o.key, "label": posixpath.dirname(o.key), "size": o.size}
        lines.append(json.dumps({**row, "etag": o.etag}) + "\n")
    return "".join(lines).encode()


def describe(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    refresh_listing: bool = False,
    store_options: dict[str, Any] | None = None,
    write_manifest: str | os.PathLike[str] | None = None,
    metadata: bool = True,
) -> Inventory:
    """What is under ``url``: objects, bytes, classes and their counts, sample sizes, the
    extensions found — from the listing saved in ``cache_dir`` when there is a young one.
    Blocking; runs its own event loop.

    ``metadata``: read the metadata files found (the root's and its folders') as a
    loader reads them, through ``cache_dir`` (kept there, so a loader on that folder then
    reads them from the disk): their rows, each column's kind and range, the images they
    name that the listing lacks and the listed images they do not name
    (:class:`~asyncloader._tools._columns.MetadataReport`).  ``False`` reads nothing but
    the listing.

    ``write_manifest``: a ``.jsonl`` (rows) or ``.npz`` (arrays: a million keys read in
    well under a second) manifest to write the samples to, with their ImageFolder label,
    size and ETag: a local file, or a URL (``s3://``, ``gs://``, ``az://``, ``file://``)
    published next to the data, for every job and node to read (reached with
    ``store_options`` when it is on the same service).  A loader given it as ``labels=``
    reads the objects from it and lists nothing (one object read instead of a listing;
    list again and write it anew when the data changes).

    Raises:
        StoreError: the store could not be listed, or a metadata file read.
        ValueError: a metadata file is malformed (naming its line), or two name one image.
        ImportError: a ``metadata.parquet`` without pyarrow installed.
    """

    config = CacheConfig(refresh_listing=refresh_listing)

    async def main() -> Inventory:
        store = open_store(url, **(store_options or {}))
        try:
            return await describe_store(
                store,
                ObjectCache.opened(cache_dir, config),
                extensions=extensions,
                listing_max_age=config.max_age,
                write_manifest=write_manifest,
                store_options=store_options,
                metadata=metadata,
            )
        finally:
            await store.close()

    return run_on_own_thread(main())


def listing(
    url: str,
    *,
    labels: object = "folder",
    store_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: int | str = CACHE_SIZE,
    listing_max_age: float = LISTING_MAX_AGE,
    refresh_listing: bool = False,
    cache: CacheConfig | None = None,
) -> Sequence[ObjectInfo]:
    """Every object under ``url``, as a loader with these options lists it: from a manifest
    given as ``labels`` with every size and ETag (``ls --write-manifest``), from the
    listing saved in ``cache_dir`` when there is a young one, else listed (in parallel
    where the store can) and saved there, once per node.  Pass it to loaders as
    ``objects=`` so that they do not list again (``asyncloader.torch.ImageDataset`` does,
    for its DataLoader workers and across ranks).  Blocking; runs its own event loop, in a
    thread of its own (so it can be called where a loop runs, as in a notebook).
    ``cache`` (a loader's :class:`~asyncloader.CacheConfig`) replaces ``cache_size``,
    ``listing_max_age`` and ``refresh_listing``.

    Raises:
        StoreError: the store could not be listed.
    """

    config = cache or CacheConfig(
        size=cache_size, listing_max_age=listing_max_age, refresh_listing=refresh_listing
    )

    async def main() -> Sequence[ObjectInfo]:
        options = store_options_for(url, labels, store_options)
        store = open_store(url, **options)
        try:
            made = ObjectCache.opened(cache_dir, config)
            folder = made.directory if made is not None else None
            return await list_for(
                store, labels, folder=folder, max_age=config.max_age, store_options=options
            )
        finally:
            await store.close()

    return run_on_own_thread(main())
