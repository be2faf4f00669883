"""The job's dataset as a rank counts it before any loader runs: the samples its loaders
will read (the same listing, labels, metadata file and mix an engine builds:
``_dataset.open_dataset``), and the batches each rank makes of them per epoch — what
``ImageDataset.classes`` and ``len(ImageDataset)`` give a model's head and a schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._base._buckets import Buckets
from .._base._config import RunConfig, ShardConfig
from .._base._filters import Filters, normalize
from .._base._own_thread import run_on_own_thread
from .._base._sources import Source, as_sources
from .._base._types import ObjectInfo
from .._dataset import open_dataset
from .._dataset._headers import CachedHeads
from .._dataset._labels import Dataset
from .._dataset._sizes import JobShare, SizeReading, bucket_index
from .._stores import open_sources, open_store
from .._stores import store_options as store_options_for
from ._sampler import num_batches
from ._sampler import samples_per_epoch as epoch_samples

__all__ = ["Dataset", "job_dataset", "rank_batches"]


def job_dataset(
    url: str | Source | Sequence[str | Source],
    labels: Any,
    given_options: dict[str, Any] | None,
    extensions: Sequence[str] | None,
    *,
    extras: Sequence[str],
    samples_per_epoch: int | None,
    filters: Filters | None = None,
    buckets: bool = False,
    upright: bool = False,
    skip_unreadable: bool = False,
    share_sizes: JobShare | None = None,
    cached: CachedHeads | None = None,
    folder: str | None,
    max_age: float,
    objects: Sequence[ObjectInfo] | None,
) -> Dataset:
    """The samples a loader of these options reads — the same listing, labels, metadata
    file and mix (``_dataset.open_dataset``, as its engine builds them), from ``objects``
    where the job's listing is known, and through ``share_sizes`` where the job's images'
    sizes are, the headers of the images the node's cache holds read there (``cached``),
    the images' sizes upright by their EXIF orientation where ``upright`` —
    on a store of its own, on a thread of its own: what a dataset of the job is counted
    from before any loader runs (its classes, its length).

    Raises:
        StoreError: the store could not be listed, or a manifest or metadata file read.
        AsyncLoaderError, ValueError: no samples, a bad option (as a loader raises them).
    """
    sources = as_sources(url, labels, given_options)
    one = url if isinstance(url, str) else ""
    options = store_options_for(one, labels, given_options) if not sources else {}

    async def main() -> Dataset:
        store = open_sources(sources) if sources else open_store(one, **options)
        try:
            listing, _ = await open_dataset(
                store,
                sources,
                labels,
                extensions,
                folder=folder,
                max_age=max_age,
                stream=False,
                listed=lambda _: None,
                objects=objects,
                store_options=options,
                extras=extras,
                samples_per_epoch=samples_per_epoch,
                filters=normalize(filters),
                sizes=SizeReading(
                    wanted=buckets,
                    skip=skip_unreadable,
                    share=share_sizes,
                    cached=cached,
                    upright=upright,
                ),
            )
            return listing.dataset if listing.dataset is not None else await listing.complete()
        finally:
            await store.close()

    return run_on_own_thread(main())


def rank_batches(
    dataset: Dataset,
    *,
    batch_size: int,
    shuffle: Any,
    rank: int,
    world_size: int,
    shard: ShardConfig,
    samples_per_epoch: int | None,
    buckets: Buckets | None = None,
    seed: int = 0,
    epoch: int = 0,
) -> int:
    """The batches rank ``rank`` of ``world_size`` makes of ``dataset`` per epoch, as its
    loader (or its DataLoader's workers together: they deal the rank's batches) makes them:
    the rank's share under ``shard``'s even rule, cut into batches by its ``drop_last``
    (of ``epoch``, under ``buckets`` and ``seed``: a bucketed epoch leaves over what does
    not fill a batch)."""
    run = RunConfig(
        batch_size=batch_size,
        shuffle=shuffle,
        rank=rank,
        world_size=world_size,
        shard=shard.for_shuffle(shuffle),
        samples_per_epoch=samples_per_epoch,
        buckets=buckets,
        seed=seed,
    )
    bucket_of = bucket_index(dataset, buckets) if buckets is not None else None
    n = epoch_samples(len(dataset.samples), run, dataset.mix, buckets=bucket_of, epoch=epoch)
    return num_batches(n, batch_size, shard.drop_last)
