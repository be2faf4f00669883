"""Several sources' datasets as one (pure): keys made URLs, labels by class name, extras
and the epoch's shares (:class:`~._mix.Mix`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .._base._types import ObjectInfo
from ._labels import Dataset
from ._metadata import Extras
from ._mix import Mix, quotas
from ._objects import ObjectList, SampleList

__all__ = ["combine", "prefixed", "with_length"]


def prefixed(objects: ObjectList, url: str) -> ObjectList:
    """``objects`` keyed by their URL: ``url`` (their source's) + key."""
    keys, sizes, etags = objects.columns()
    return ObjectList([(url + k).encode() for k in keys], sizes, [e.encode() for e in etags])


def combine(
    datasets: Sequence[Dataset],
    urls: Sequence[str],
    weights: Sequence[float] | None,
    samples_per_epoch: int | None,
) -> Dataset:
    """One dataset of the sources' ``datasets`` (source ``s`` at ``urls[s]``), in source
    order, each key its object's URL.  Labels: where the sources name classes (folders,
    text labels), the classes are the sorted union of their names and a name is one label
    in every source; where none does, the labels as they are.

    Raises:
        ValueError: some sources name classes and others give bare numbers; extras that
            differ between sources (a bug: every source is asked the same).
    """
    named = [bool(d.classes) for d in datasets]
    if any(named) and not all(named):
        which = ", ".join(
            f"{u} ({'classes' if n else 'numbers'})" for u, n in zip(urls, named, strict=True)
        )
        raise ValueError(f"the sources label differently, by class name or by number: {which}")
    classes = tuple(sorted({c for d in datasets for c in d.classes}))
    index = {c: i for i, c in enumerate(classes)}
    labels = []
    for d in datasets:
        own = np.asarray(d.samples.labels, dtype=np.int64)
        if classes:
            own = np.asarray([index[c] for c in d.classes], dtype=np.int64)[own]
        labels.append(own)
    objects = ObjectList.concat(
        [prefixed(d.samples.objects, url) for d, url in zip(datasets, urls, strict=True)]
    )
    samples = SampleList(objects, np.concatenate(labels) if labels else [])
    sizes = tuple(len(d.samples) for d in datasets)
    mix = Mix(tuple(urls), sizes, quotas(sizes, weights, samples_per_epoch))
    extras = _extras([d.extras for d in datasets], urls)
    unnamed, filtered = sum(d.unnamed for d in datasets), sum(d.filtered for d in datasets)
    pixels = [d.sizes for d in datasets if d.sizes is not None]
    sized = np.concatenate(pixels) if len(pixels) == len(datasets) and pixels else None
    return Dataset(samples, classes, extras, unnamed, mix, filtered, sized)


def with_length(dataset: Dataset, url: str, samples_per_epoch: int) -> Dataset:
    """One source's dataset with ``samples_per_epoch`` samples an epoch (a mix of one)."""
    n = len(dataset.samples)
    mix = Mix((url,), (n,), quotas([n], None, samples_per_epoch))
    return dataclasses.replace(dataset, mix=mix)


def _extras(each: Sequence[Extras | None], urls: Sequence[str]) -> Extras | None:
    if all(e is None for e in each):
        return None
    if any(e is None for e in each) or len({e.names for e in each if e is not None}) != 1:
        raise ValueError("the sources' extras differ")
    first = each[0]
    assert first is not None
    columns = {n: [v for e in each if e is not None for v in e.columns[n]] for n in first.columns}
    sidecars: dict[str, list[ObjectInfo | None]] = {n: [] for n in first.sidecars}
    for e, url in zip(each, urls, strict=True):
        assert e is not None
        for n, objs in e.sidecars.items():
            sidecars[n] += [
                None if o is None else ObjectInfo(url + o.key, o.size, o.etag) for o in objs
            ]
    return Extras(first.names, columns, sidecars, first.suffixes)
