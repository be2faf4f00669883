"""The dataset of a run: a store (URL) and a labels policy → its samples and labels.

The listing strategy lives here, on the loader's event loop:

* a listing the cache saved for the URL, if young enough (``listing_max_age``);
* else, for an unshuffled run on a store that lists in sorted chunks (S3, Azure), a
  :class:`Listing` that grows while the store still lists, so the first batches start on
  the first keys;
* else the whole listing (in parallel where the store can), saved in the cache for the next
  run; with a manifest (``labels="train.jsonl"``, a local file or a key beside the images)
  the manifest names the samples and their labels (a URL too: ``s3://bucket/train.npz``).

Which objects are samples and what their labels are is :mod:`asyncloader._dataset._labels` (pure).

Its modules: compact object lists (``_objects``), which objects are samples and their
labels (``_labels``), the metadata files and sidecars (``_metadata``), several sources'
shares (``_mix``) and datasets as one (``_combine``), manifests by location (``_located``),
the listing through a cache folder, once per node (``_listing``), saved listings and the
listing turn (``_saved``), each sample's pixel size for aspect-ratio buckets (``_sizes``;
the images' headers read for it, ``_headers``, and what an image's first bytes say of its
size, ``_imagesize``, an AVIF's read from its ``meta`` box, ``_avif``), which samples
pass ``filters=`` (``_filtering``: the columns a filter names, the headers' width and
height among them).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from .._base._errors import AsyncLoaderError
from .._base._filters import Normal
from .._base._manifest import is_columnar, is_manifest, read_manifest
from .._base._sources import Source
from .._base._stats import Counters
from .._base._types import UNSIZED, ObjectInfo, ObjectStore, Sample
from .._stores._mixed import MixedStore
from ._combine import combine, prefixed, with_length
from ._filtering import header_columns, size_test
from ._headers import Stays, every_one
from ._labels import (
    Dataset,
    DatasetBuilder,
    LabelSpec,
    build_dataset,
    filter_by_size,
    is_column,
    manifest_objects,
    no_samples,
    parse_manifest,
    read_columnar_manifest,
    read_keys,
)
from ._listing import (
    complete_sizes,
    list_and_save,
    list_objects,
    listing_turn,
    metadata_file,
    read_metadata_files,
    saved_listing,
)
from ._located import read_manifest_file
from ._objects import ObjectList
from ._saved import listing_path, save_listing
from ._sizes import NO_SIZES, SizeReading, asking_with_heads, with_sizes

__all__ = [
    "Listing",
    "list_for",
    "list_objects",
    "metadata_file",
    "open_dataset",
    "open_listing",
    "open_mixed_listing",
    "saved_listing",
]


class Listing:
    """The samples of a run: complete, or growing in key order while the store still lists.

    Only a run that does not shuffle can use a growing list (its first batches are the first
    keys); :meth:`stream` fills it, and everything else waits for :meth:`wait` or
    :meth:`complete`.  Lives on the loader's event loop.
    """

    def __init__(self, dataset: Dataset | None = None) -> None:
        self.dataset = dataset
        self.samples: Sequence[Sample] = dataset.samples if dataset is not None else ()
        self.error: BaseException | None = None
        self._grew = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.dataset is not None

    def _notify(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    async def stream(
        self,
        chunks: AsyncIterator[tuple[list[ObjectInfo], list[ObjectInfo]]],
        builder: DatasetBuilder,
        finished: Callable[[list[ObjectInfo], Dataset], Awaitable[None]],
    ) -> None:
        """Add the store's sorted chunks as they come; at the end ``finished(objects,
        dataset)`` (which may raise, say for an empty dataset) completes the listing."""
        self.samples = builder.samples
        objects: list[ObjectInfo] = []
        try:
            async for chunk, ahead in chunks:
                objects.extend(chunk)
                builder.add(chunk, ahead)
                self._notify()
            dataset = builder.finish()
            await finished(objects, dataset)
            self.dataset = dataset
            self.samples = dataset.samples  # compact: the builder's list goes
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._notify()

    async def wait(self, n: int) -> int:
        """Wait until ``n`` samples are listed or the listing is complete; how many are.

        Raises:
            The listing's error, if it failed.
        """
        while len(self.samples) < n and self.dataset is None:
            if self.error is not None:
                raise self.error
            await self._grew.wait()
        return len(self.samples)

    async def complete(self) -> Dataset:
        """The whole dataset, once listed."""
        while self.dataset is None:
            await self.wait(len(self.samples) + 1)
        return self.dataset


async def list_for(
    store: ObjectStore,
    labels: object,
    *,
    folder: str | None,
    max_age: float,
    store_options: Mapping[str, Any] | None = None,
) -> Sequence[ObjectInfo]:
    """Every object a run over ``store`` with ``labels`` reads from: a columnar manifest's
    objects, a manifest's rows when every one has its size and ETag, else the store's
    listing (the cache's saved one if younger than ``max_age`` [seconds], else listed and
    saved, once per node).  ``store_options``: how to reach a manifest URL outside the
    store's root.  Every object is sized (one listing serves every process of a job, each
    reading its own part).

    Raises:
        StoreError: the store or the manifest could not be read.
    """
    if is_columnar(labels):  # its objects are the listing
        assert isinstance(labels, str)
        data = await read_manifest_file(store, labels, store_options)
        dataset = await asyncio.to_thread(read_columnar_manifest, data, labels)
        return dataset.samples.objects
    if is_manifest(labels):  # one with every size and ETag is the listing
        assert isinstance(labels, str)
        data = await read_manifest_file(store, labels, store_options)
        objects = manifest_objects(data, labels)
        if objects is not None:
            return objects
    return await list_objects(store, folder, max_age)


async def open_listing(
    store: ObjectStore,
    labels: LabelSpec,
    extensions: Sequence[str] | None,
    *,
    folder: str | None,
    max_age: float,
    stream: bool,
    listed: Callable[[Sequence[ObjectInfo]], None],
    objects: Sequence[ObjectInfo] | None = None,
    store_options: Mapping[str, Any] | None = None,
    extras: Sequence[str] = (),
    samples_per_epoch: int | None = None,
    filters: Normal | None = None,
    counters: Counters | None = None,
    sizes: SizeReading = NO_SIZES,
) -> tuple[Listing, asyncio.Task[None] | None]:
    """The run's samples: complete, or (``stream``: an unshuffled run) growing in key order
    while a task, returned with it, still lists.  ``listed(objects)`` is told of the whole
    listing when it is complete.  ``objects``: listed already (nothing is listed).
    ``store_options``: how to reach a manifest URL outside the store's root.  ``extras``:
    what each sample carries besides its label; with them, or with a labels column, the
    metadata files (the root's and its folders') are read (:mod:`._metadata`), and the
    listing never streams.
    ``samples_per_epoch``: an epoch of that many samples (see :mod:`._mix`).  ``filters``:
    the samples kept (:mod:`asyncloader._base._filters`), before anything is fetched;
    with them the listing never streams.  The metadata file comes from the cache folder
    where a copy of its listed ETag is kept (:func:`metadata_file`); ``counters``: its
    request, or its bytes read from the node's disk.  ``sizes``: how the images' sizes are
    read where they are needed (:class:`._sizes.SizeReading`): ``wanted``, each sample's
    pixel size is kept (aspect-ratio buckets), and the listing then never streams;
    ``skip`` (``on_error="skip"``), an image whose header cannot be read keeps an unknown
    size (it fails, and is counted, when read) rather than failing the listing; ``share``,
    the job's, so that one process of the job reads the headers.

    Raises:
        AsyncLoaderError: no samples under the URL (when complete; a growing listing raises
            it from its task, and from :meth:`Listing.wait`).
        StoreError: the listing or the manifest could not be read.
    """

    def check(objects: Sequence[ObjectInfo], dataset: Dataset) -> None:
        listed(objects)
        if not dataset.samples:
            raise AsyncLoaderError(no_samples(store.url, len(objects), extensions, dataset))

    if is_columnar(labels):  # the samples, labels and objects as arrays: no LIST, no rows
        assert isinstance(labels, str)
        if extras or filters is not None:
            what = f"extras={tuple(extras)!r}" if extras else "filters="
            raise ValueError(
                f"{what} reads the listing (sidecars, the metadata file): "
                f"a columnar manifest ({labels}) has the samples only"
            )
        data = await read_manifest_file(store, labels, store_options)
        dataset = await asyncio.to_thread(read_columnar_manifest, data, labels)
        check(dataset.samples.objects, dataset)
        if sizes.wanted:
            dataset = await with_sizes(
                store, dataset, None, folder, counters, sizes, stays=every_one
            )
        return Listing(of_length(dataset, store.url, samples_per_epoch)), None
    manifest_data = None
    if is_manifest(labels):
        assert isinstance(labels, str)
        data = await read_manifest_file(store, labels, store_options)
        manifest_data = await asyncio.to_thread(read_manifest, data, labels)  # parsed once
        if objects is None:  # a manifest with every size and ETag is a listing: no LIST
            objects = manifest_objects(manifest_data, labels)
    saved = ObjectList.of(objects) if objects is not None else None
    turn = None
    if saved is None:
        saved, turn = await listing_turn(store, folder, max_age, unsized=True)
    try:
        list_sorted = getattr(store, "list_sorted", None)
        # Sizes read it too: its width and height columns spare a header read each.
        wanted = sizes.wanted
        wants_metadata = bool(extras) or is_column(labels) or filters is not None or wanted
        streams = stream and not wants_metadata and samples_per_epoch is None and not wanted
        if saved is None and not is_manifest(labels) and streams and list_sorted:
            listing = Listing()

            async def finished(objects: list[ObjectInfo], dataset: Dataset) -> None:
                check(objects, dataset)
                if folder is not None:
                    path = listing_path(folder, store.url)
                    await asyncio.to_thread(save_listing, path, store.url, objects)

            builder = DatasetBuilder(labels, extensions)
            task = asyncio.create_task(
                listing.stream(list_sorted(), builder, finished), name="asyncloader-listing"
            )
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            if turn is not None:  # the turn ends with the listing, saved or failed
                release = turn.release
                task.add_done_callback(lambda _: release())
                turn = None
            await listing.wait(1)  # an empty or unreadable prefix fails here, at once
            return listing, task
        objects = saved if saved is not None else await list_and_save(store, folder, unsized=True)
    finally:
        if turn is not None:
            turn.release()
    manifest = None
    if manifest_data is not None:
        assert isinstance(labels, str)
        manifest = parse_manifest(manifest_data, labels)
    all_listed = ObjectList.of(objects)
    metadata = None
    if wants_metadata and manifest is None:
        metadata = await read_metadata_files(store, folder, all_listed, counters)

    def build(listed: ObjectList) -> Dataset:
        return build_dataset(
            listed,
            labels,
            extensions=extensions,
            manifest=manifest,
            metadata=metadata,
            extras=extras,
            source=store.url,
            filters=filters,
        )

    dataset = await asyncio.to_thread(build, all_listed)
    later = header_columns(filters, metadata)
    if dataset.samples and bool((all_listed.sizes() == UNSIZED).any()):
        # A web server's folder (listed by this loader: a job's one listing sizes every
        # object): the sizes of what the run reads are asked now, once the filter has left
        # out what it never reads (built again with them: a filter on ``size`` decides
        # then); with the images' first bytes where their headers are read next (those
        # read whole kept in the cache where no filter on the sizes may leave them out).
        ask = None
        if sizes.wanted or later:
            named = {column for group in filters or [] for column, _, _ in group}
            kept: Stays | None = every_one
            if "size" in named:  # decided once the sizes are known: none kept before
                kept = None
            elif later:
                assert filters is not None
                kept = size_test(dataset.samples.objects, metadata, filters)
            images = set(dataset.samples.objects.keys())
            ask = asking_with_heads(store, folder, counters, sizes, images, kept)
        keys = read_keys(dataset, all_listed)
        sized = await complete_sizes(store, folder, all_listed, keys, ask)
        if sized is not all_listed:
            all_listed = sized
            dataset = await asyncio.to_thread(build, all_listed)
    check(all_listed, dataset)
    if sizes.wanted or later:
        # The images their header's read fetched whole are cached where they stay samples:
        # every one, or those the filter on the sizes keeps.
        stays: Stays = every_one
        if later:
            assert filters is not None
            stays = size_test(dataset.samples.objects, metadata, filters)
        dataset = await with_sizes(store, dataset, metadata, folder, counters, sizes, stays=stays)
    if later:  # the filter again, with the headers' width and height
        assert filters is not None
        dataset = await asyncio.to_thread(filter_by_size, dataset, metadata, filters)
        if not dataset.samples:
            raise AsyncLoaderError(no_samples(store.url, len(all_listed), extensions, dataset))
        if not sizes.wanted:  # a bucketed run's only
            dataset = dataclasses.replace(dataset, sizes=None)
    return Listing(of_length(dataset, store.url, samples_per_epoch)), None


async def open_mixed_listing(
    store: MixedStore,
    sources: Sequence[Source],
    extensions: Sequence[str] | None,
    *,
    folder: str | None,
    max_age: float,
    listed: Callable[[Sequence[ObjectInfo]], None],
    extras: Sequence[str] = (),
    samples_per_epoch: int | None = None,
    objects: Sequence[ObjectInfo] | None = None,
    filters: Normal | None = None,
    counters: Counters | None = None,
    sizes: SizeReading = NO_SIZES,
) -> Listing:
    """The samples of several ``sources`` (``store``'s stores, in order; resolved, each
    with its labels and store options: :func:`~asyncloader._base._sources.as_sources`),
    listed together,
    each as :func:`open_listing` lists one (through the cache's saved listing of its own
    URL), then made one dataset (:func:`~._combine.combine`).  ``listed`` is told every
    object, keyed by its URL; ``objects``: listed already, so keyed (nothing is listed).

    Raises:
        AsyncLoaderError: a source without samples, naming it.
        StoreError: a listing or a manifest could not be read.
    """
    found: list[ObjectList] = [ObjectList.of(()) for _ in sources]
    given: list[list[ObjectInfo]] | None = None
    if objects is not None:  # split by source, keyed as each source's store keys them
        given = [[] for _ in sources]
        at = {id(part): s for s, part in enumerate(store.stores)}
        for obj in objects:
            part, key = store.part(obj.key)
            given[at[id(part)]].append(ObjectInfo(key, obj.size, obj.etag))

    async def one(s: int) -> Dataset:
        source, part = sources[s], store.stores[s]

        def keep(objects: Sequence[ObjectInfo]) -> None:
            found[s] = prefixed(ObjectList.of(objects), part.url)

        listing, _ = await open_listing(
            part,
            source.labels,
            extensions,
            folder=folder,
            max_age=max_age,
            stream=False,
            listed=keep,
            store_options=source.store_options,
            extras=extras,
            objects=given[s] if given is not None else None,
            filters=filters,
            counters=counters,
            sizes=sizes,
        )
        assert listing.dataset is not None
        return listing.dataset

    datasets = await asyncio.gather(*(one(s) for s in range(len(sources))))
    weights = None if sources[0].weight is None else [s.weight or 0.0 for s in sources]
    urls = [part.url for part in store.stores]
    dataset = await asyncio.to_thread(combine, datasets, urls, weights, samples_per_epoch)
    listed(ObjectList.concat(found))
    return Listing(dataset)


def of_length(dataset: Dataset, url: str, samples_per_epoch: int | None) -> Dataset:
    """One source's dataset, with ``samples_per_epoch`` samples an epoch where given."""
    return dataset if samples_per_epoch is None else with_length(dataset, url, samples_per_epoch)


async def open_dataset(
    store: ObjectStore,
    sources: Sequence[Source] | None,
    labels: LabelSpec,
    extensions: Sequence[str] | None,
    *,
    folder: str | None,
    max_age: float,
    stream: bool,
    listed: Callable[[Sequence[ObjectInfo]], None],
    objects: Sequence[ObjectInfo] | None = None,
    store_options: Mapping[str, Any] | None = None,
    extras: Sequence[str] = (),
    samples_per_epoch: int | None = None,
    filters: Normal | None = None,
    counters: Counters | None = None,
    sizes: SizeReading = NO_SIZES,
) -> tuple[Listing, asyncio.Task[None] | None]:
    """A loader's samples, of one source (:func:`open_listing`) or of several
    (``sources``, ``store`` their :class:`MixedStore`: :func:`open_mixed_listing`, which
    never streams): what an engine reads, and what the job's dataset is counted from."""
    if sources:
        assert isinstance(store, MixedStore)
        mixed = await open_mixed_listing(
            store,
            sources,
            extensions,
            folder=folder,
            max_age=max_age,
            listed=listed,
            extras=extras,
            samples_per_epoch=samples_per_epoch,
            objects=objects,
            filters=filters,
            counters=counters,
            sizes=sizes,
        )
        return mixed, None
    return await open_listing(
        store,
        labels,
        extensions,
        folder=folder,
        max_age=max_age,
        stream=stream,
        listed=listed,
        objects=objects,
        store_options=store_options,
        extras=extras,
        samples_per_epoch=samples_per_epoch,
        filters=filters,
        counters=counters,
        sizes=sizes,
    )
