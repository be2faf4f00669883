"""From a listing to the dataset: which objects are samples, and their integer labels.

* ``"folder"`` — the ImageFolder convention: the label of ``cat/001.jpg`` is the index of
  ``cat`` among the sorted names of the folders holding images (``classes``).
* a columnar manifest (``.npz``, written by ``ls --write-manifest``): the objects with
  their sizes, ETags and labels as arrays, for a million keys read in well under a second;
* a manifest (``.jsonl`` lines ``{"key": ..., "label": ...}`` or ``.csv`` with a
  ``key,label`` header): the manifest names the samples and their labels, in its order.
  Labels that are not integers are mapped to the index of their sorted distinct values.
* a callable ``key -> int``.
* ``None`` — every label is -1.
"""

from __future__ import annotations

import bisect
import dataclasses
import io
import logging
import posixpath
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._base._config import IMAGE_EXTENSIONS
from .._base._errors import StoreError, shown_key
from .._base._filters import Normal
from .._base._manifest import is_manifest, normalize_etag, read_manifest
from .._base._types import ObjectInfo, Sample
from ._filtering import metadata_rows, passing
from ._metadata import METADATA_NAMES, Extras, Metadata, metadata_objects, resolve_extras
from ._mix import Mix
from ._objects import ObjectList, SampleList, texts_from_arrays, texts_to_arrays

__all__ = [
    "IMAGE_EXTENSIONS",
    "no_samples",
    "Dataset",
    "DatasetBuilder",
    "KeyFilter",
    "key_path",
    "build_dataset",
    "columnar_manifest",
    "read_columnar_manifest",
    "manifest_objects",
    "parse_manifest",
]


def no_samples(
    url: str, listed: int, extensions: Sequence[str] | None, dataset: Dataset | None = None
) -> str:
    """Why ``url`` gave no samples (``listed`` objects were listed there; ``dataset``, the
    empty one made of them), and where to look: one message for the loader, ``ls`` and
    ``bench``."""
    if dataset is not None and dataset.filtered:
        return (
            f"no samples under {url}: filters= left out every one of its "
            f"{dataset.filtered} images (stats().filtered_out counts them in a run that "
            "keeps some)"
        )
    if listed == 0:
        return (
            f"no samples under {url}: nothing is listed there. Is the prefix right? Keys "
            "start with it (s3://bucket/train/ lists the keys train/...); `asyncloader ls` "
            "of the folder above shows what is there"
        )
    return (
        f"no samples under {url}: {listed} objects listed, none of them with an image "
        f"extension ({', '.join(extensions or ())}). `asyncloader ls --all-objects` counts "
        "every object; a loader's extensions= picks others"
    )


log = logging.getLogger("asyncloader")
_said_flat = False  # the word on a flat folder, said once per process


def _folder_classes(classes: tuple[str, ...]) -> tuple[str, ...]:
    """``classes`` of ``labels="folder"``, with a word where every sample is at the root (a
    flat folder, Hugging Face's imagefolder layout): one class ``''``, every label 0 — not
    an error, but never silent."""
    global _said_flat
    if classes == ("",) and not _said_flat:
        _said_flat = True
        log.warning(
            "asyncloader: every image is at the root, in no class folder: labels='folder' "
            "(the default) gives them all label 0 (class ''). Pass labels=None for no "
            "labels, a metadata column (labels='label') or a manifest."
        )
    return classes


LabelSpec = str | Callable[[str], int] | None


@dataclass(frozen=True, slots=True)
class Dataset:
    """The samples of one run, in canonical order, and the class names (may be empty).
    ``samples`` is compact (a :class:`SampleList`: arrays, not an object per sample).
    ``extras``: what ``extras=`` asks for, per sample; ``unnamed``: images left out because
    no metadata file names them; ``mix``: the sources the samples come
    from and their share of an epoch (several sources, or a ``samples_per_epoch``);
    ``filtered``: samples ``filters=`` left out; ``sizes``: each sample's ``(height,
    width)`` [pixels] where a bucketed run needs them (:mod:`._sizes`)."""

    samples: SampleList
    classes: tuple[str, ...]
    extras: Extras | None = None
    unnamed: int = 0
    mix: Mix | None = None
    filtered: int = 0
    sizes: npt.NDArray[np.int64] | None = None


def read_keys(dataset: Dataset, listed: ObjectList) -> set[str]:
    """The keys of what a run of ``dataset`` (of ``listed``) reads: its samples, their
    sidecars and the metadata files."""
    keys = set(dataset.samples.objects.keys())
    if dataset.extras is not None:
        for objs in dataset.extras.sidecars.values():
            keys.update(o.key for o in objs if o is not None)
    keys.update(o.key for o in metadata_objects(listed))
    return keys


Rows = list[dict[str, str]]
"""A manifest's rows, as :func:`asyncloader._base._manifest.read_manifest` parses them (once)."""


def parse_manifest(data: bytes | bytearray | Rows, name: str) -> list[tuple[str, str]]:
    """A JSONL or CSV manifest (or its parsed rows) as ``(key, label)`` pairs (label as
    text; -1: none).

    Raises:
        ValueError: a malformed line, naming the manifest and line number.
    """
    rows = data if isinstance(data, list) else read_manifest(data, name)
    return [(row["key"], row.get("label", "-1")) for row in rows]


def manifest_objects(data: bytes | bytearray | Rows, name: str) -> ObjectList | None:
    """The objects of a manifest (or its parsed rows) whose every row has its size and
    ETag (one written by ``asyncloader ls --write-manifest``): a listing, read from one
    file.  None otherwise.

    Raises:
        ValueError: a malformed line, naming the manifest and line number.
    """
    rows = data if isinstance(data, list) else read_manifest(data, name)
    if not rows or not all("size" in r and "etag" in r for r in rows):
        return None
    try:
        return ObjectList(
            [r["key"].encode() for r in rows],
            [int(r["size"]) for r in rows],
            [normalize_etag(r["etag"]).encode() for r in rows],
        )
    except ValueError as exc:
        raise ValueError(f"{name}: a size that is not a number") from exc


def columnar_manifest(objects: ObjectList, labels: Sequence[str]) -> dict[str, Any]:
    """A manifest as arrays (``.npz``): the objects (keys, sizes, ETags) and their labels
    as indices, with the class names — the dataset a JSONL manifest of the same rows makes
    (labels that are all integers stay integers), read without a Python object per row."""
    idx, classes = _label_index(labels)
    return {
        **objects.arrays(),
        "label_index": np.asarray(idx, dtype=np.int64),
        **texts_to_arrays("classes", classes),
    }


def read_columnar_manifest(data: bytes | bytearray, name: str) -> Dataset:
    """The dataset of a columnar manifest (:func:`columnar_manifest`), in its order.

    Raises:
        ValueError: not such a manifest, or a damaged one, naming it.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            objects = ObjectList.from_arrays(arrays)
            labels = np.asarray(arrays["label_index"], dtype=np.int64)
            classes = tuple(texts_from_arrays(arrays, "classes"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{name}: not a columnar manifest ({exc})") from exc
    if len(labels) != len(objects) or (classes and len(labels) and labels.max() >= len(classes)):
        raise ValueError(f"{name}: a damaged columnar manifest (labels do not fit)")
    return Dataset(SampleList(objects, labels), classes)


def _label_index(values: Sequence[str]) -> tuple[list[int], tuple[str, ...]]:
    try:
        return [int(v) for v in values], ()
    except ValueError:
        classes = tuple(sorted(set(values)))
        index = {c: i for i, c in enumerate(classes)}
        return [index[v] for v in values], classes


def key_path(key: str) -> str:
    """The object's name in ``key``: an absolute URL (a presigned one) without its query
    string or fragment, which are no part of the name; any other key as it is."""
    if "://" in key:
        return key.split("?", 1)[0].split("#", 1)[0]
    return key


class KeyFilter:
    """Which keys count as samples: those ending with one of ``extensions`` (any case).

    A key that is an absolute URL (a manifest of presigned URLs) is judged by its path: its
    query string is no part of the object's name.
    """

    __slots__ = ("_exts",)

    def __init__(self, extensions: Sequence[str] | None) -> None:
        self._exts = tuple(e.lower() for e in extensions) if extensions is not None else None

    def __call__(self, key: str) -> bool:
        if self._exts is None:
            return True
        return key_path(key).lower().endswith(self._exts)


def is_column(labels: LabelSpec) -> bool:
    """Whether ``labels`` names a column of the metadata files (``"label"``): a
    string that is neither ``"folder"`` nor a manifest's name."""
    return isinstance(labels, str) and labels != "folder" and not is_manifest(labels)


def build_dataset(
    objects: Iterable[ObjectInfo],
    labels: LabelSpec,
    *,
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    manifest: list[tuple[str, str]] | None = None,
    metadata: Metadata | None = None,
    extras: Sequence[str] = (),
    source: str = "",
    filters: Normal | None = None,
) -> Dataset:
    """Turn a listing into the dataset.

    Args:
        objects: The listing (any order).
        labels: ``"folder"``, a metadata column, a callable, or ``None``; ignored when
            ``manifest`` is given.
        extensions: Keep keys ending with one of these (case-insensitive); None keeps all.
        manifest: Parsed manifest rows; keys it names that the listing lacks are kept (with
            unknown size), so the run reports them as missing instead of silently dropping.
        metadata: The metadata files' rows: the images they name are the samples (see
            :mod:`._metadata`).
        extras: What each sample carries besides its label (:func:`resolve_extras`).
        source: The samples' source URL (the ``"source"`` extra).
        filters: Which samples to keep (:mod:`asyncloader._base._filters`), over the
            metadata's columns and the listing's; labels are given before (a class
            filtered away keeps its index).

    Raises:
        ValueError: a labels column without a metadata file, or that the file lacks, or
            that a sample's row leaves empty; an extra that names nothing; a filter over a
            column there is not, or whose values cannot be compared.
    """
    listed = ObjectList.of(objects)
    dataset = _samples(listed, labels, extensions, manifest, metadata)
    if not extras and filters is None:
        return dataset
    keys = dataset.samples.objects.keys()
    rows = None
    if metadata is not None:
        rows = metadata_rows(metadata, keys)
    if filters is not None:
        dataset, keys, rows = _filtered(dataset, keys, rows, metadata, filters)
    if not extras:
        return dataset
    by_key = dict(zip(listed.keys(), listed, strict=True))
    found = resolve_extras(extras, keys, by_key, source=source, metadata=metadata, rows=rows)
    return Dataset(
        dataset.samples, dataset.classes, found, dataset.unnamed, filtered=dataset.filtered
    )


def _filtered(
    dataset: Dataset,
    keys: list[str],
    rows: list[int] | None,
    metadata: Metadata | None,
    filters: Normal,
) -> tuple[Dataset, list[str], list[int] | None]:
    """The samples of ``dataset`` (keys ``keys``, metadata rows ``rows``) that may pass
    ``filters`` (all of them pass it, unless it names a column of the headers: see
    :func:`filter_by_size`), with their keys and rows; those left out are counted
    (``filtered``)."""
    objects = dataset.samples.objects
    at = np.flatnonzero(passing(objects, keys, rows, metadata, filters))
    samples = SampleList(objects.take(at), dataset.samples.labels[at])
    left = len(keys) - len(at)
    kept = Dataset(samples, dataset.classes, unnamed=dataset.unnamed, filtered=left)
    return kept, [keys[i] for i in at], None if rows is None else [rows[i] for i in at]


def filter_by_size(dataset: Dataset, metadata: Metadata | None, filters: Normal) -> Dataset:
    """``dataset`` (filtered already by :func:`build_dataset`, its ``sizes`` read) with
    ``filters`` applied again with the headers' ``width`` and ``height`` known: the samples
    left out now are counted in ``filtered`` too, their extras and sizes dropped.  An image
    whose header could not be read (size ``(0, 0)``, under ``on_error="skip"``) is kept: it
    fails, a counted skip, when it is read."""
    assert dataset.sizes is not None
    objects = dataset.samples.objects
    keys = objects.keys()
    rows = metadata_rows(metadata, keys) if metadata is not None else None
    unread = ~(dataset.sizes > 0).all(axis=1)
    at = np.flatnonzero(passing(objects, keys, rows, metadata, filters, dataset.sizes) | unread)
    return dataclasses.replace(
        dataset,
        samples=SampleList(objects.take(at), dataset.samples.labels[at]),
        extras=dataset.extras.take(at.tolist()) if dataset.extras is not None else None,
        filtered=dataset.filtered + len(keys) - len(at),
        sizes=dataset.sizes[at],
    )


def _samples(
    listed: ObjectList,
    labels: LabelSpec,
    extensions: Sequence[str] | None,
    manifest: list[tuple[str, str]] | None,
    metadata: Metadata | None,
) -> Dataset:
    keys = listed.keys()
    if manifest is not None:
        # The manifest's order and labels; a key the listing lacks keeps an unknown size.
        named = [key for key, _ in manifest]
        if named == keys:  # the objects came from the manifest itself, in its order
            idx, classes = _label_index([label for _, label in manifest])
            return Dataset(SampleList(listed, idx), classes)
        idx, classes = _label_index([label for _, label in manifest])
        return Dataset(SampleList(_take(listed, named), idx), classes)
    keep = KeyFilter(extensions)
    if metadata is not None:
        return _named(listed, labels, keep, metadata)
    if is_column(labels):
        raise ValueError(
            f"labels={labels!r} names a column of a metadata file, and there is none "
            f"({' or '.join(METADATA_NAMES)} at the root or in its folders)"
        )
    order = sorted((i for i, k in enumerate(keys) if keep(k)), key=keys.__getitem__)
    # One sample per key (a listing names each key once; a repeated one is kept once).
    order = [i for n, i in enumerate(order) if n == 0 or keys[i] != keys[order[n - 1]]]
    return _labelled(listed.take(order), [keys[i] for i in order], labels)


def _take(listed: ObjectList, names: list[str]) -> ObjectList:
    """The listed objects of ``names``, in that order; a name the listing lacks keeps an
    unknown size (the run reports it missing instead of silently dropping it)."""
    where = {k: i for i, k in enumerate(listed.keys())}
    at = [where.get(name, -1) for name in names]
    if all(i >= 0 for i in at):
        return listed.take(at)
    return ObjectList.of(
        listed[i] if i >= 0 else ObjectInfo(name, -1, "") for i, name in zip(at, names, strict=True)
    )


def _named(listed: ObjectList, labels: LabelSpec, keep: KeyFilter, metadata: Metadata) -> Dataset:
    """The samples a metadata file names, in key order; a name nothing was listed under is
    kept with an unknown size (reported missing when read)."""
    keys = listed.keys()
    rows = sorted(
        (r for r, name in enumerate(metadata.file_names) if keep(name)),
        key=metadata.file_names.__getitem__,
    )
    names = [metadata.file_names[r] for r in rows]
    chosen = _take(listed, names)
    named = set(names)
    unnamed = sum(1 for k in keys if keep(k) and k not in named)
    if is_column(labels):
        assert isinstance(labels, str)
        values = metadata.columns.get(labels)
        if values is None:
            raise ValueError(
                f"labels={labels!r}: {metadata.name} has no such column "
                f"(it has {', '.join(metadata.columns) or 'only file_name'})"
            )
        texts = []
        for r in rows:
            if values[r] is None:
                raise ValueError(
                    f"labels={labels!r}: {metadata.name} gives no {labels!r} for "
                    f"{metadata.file_names[r]!r}"
                )
            texts.append(str(values[r]))
        idx, classes = _label_index(texts)
        return Dataset(SampleList(chosen, idx), classes, unnamed=unnamed)
    found = _labelled(chosen, names, labels)
    return Dataset(found.samples, found.classes, unnamed=unnamed)


def _labelled(chosen: ObjectList, names: list[str], labels: LabelSpec) -> Dataset:
    """The samples ``chosen`` (keys ``names``) labelled by folder, callable or None."""
    if labels == "folder":
        parents = [posixpath.dirname(k) for k in names]
        classes = _folder_classes(tuple(sorted(set(parents))))
        index = {c: i for i, c in enumerate(classes)}
        return Dataset(SampleList(chosen, [index[p] for p in parents]), classes)
    if labels is None:
        return Dataset(SampleList(chosen, np.full(len(names), -1)), ())
    if callable(labels):
        return Dataset(SampleList(chosen, [int(labels(k)) for k in names]), ())
    raise ValueError(
        f"labels must be 'folder', a manifest, a metadata column, a callable or None, "
        f"not {labels!r}"
    )


class DatasetBuilder:
    """The dataset of :func:`build_dataset`, built while an ordered listing streams in.

    ``add`` takes the listing in sorted key order, a chunk at a time; ``samples`` grows
    with it, each sample with its final label.  With ``"folder"`` labels that needs the
    listing to keep one promise: when a chunk is added, every class (image folder) that
    sorts before a class of the chunk is already known — from earlier chunks, the chunk
    itself, or ``ahead`` (objects listed already that come later in key order).  Key order
    and class order differ (``b./x.jpg`` sorts before ``b/x.jpg``, class ``b`` before
    ``b.``); ``_stores/_listing.py`` keeps the promise, and a broken one raises here
    rather than label a sample wrongly.
    """

    def __init__(self, labels: LabelSpec, extensions: Sequence[str] | None) -> None:
        if labels is not None and labels != "folder" and not callable(labels):
            raise ValueError(f"cannot stream a listing with labels={labels!r}")
        self._labels = labels
        self._keep = KeyFilter(extensions)
        self._parents: list[str] = []  # sorted class names known so far
        self._last = ""
        self._given: dict[str, int] = {}  # class → the label its samples were given
        self.samples: list[Sample] = []

    def _know(self, parent: str) -> None:
        at = bisect.bisect_left(self._parents, parent)
        if at == len(self._parents) or self._parents[at] != parent:
            self._parents.insert(at, parent)

    def add(self, objects: Sequence[ObjectInfo], ahead: Iterable[ObjectInfo] = ()) -> None:
        """Append ``objects`` (the next keys in sorted order) as samples."""
        keep = [o for o in objects if self._keep(o.key)]
        if keep and keep[0].key <= self._last:
            raise StoreError(
                f"the listing came out of key order: {shown_key(keep[0].key)!r} after "
                f"{shown_key(self._last)!r}"
            )
        if keep:
            self._last = keep[-1].key
        labels = self._labels
        if labels is None:
            self.samples.extend(Sample(o, -1) for o in keep)
        elif callable(labels):
            self.samples.extend(Sample(o, int(labels(o.key))) for o in keep)
        else:
            for o in ahead:
                if self._keep(o.key):
                    self._know(posixpath.dirname(o.key))
            parents = [posixpath.dirname(o.key) for o in keep]
            for p in set(parents):
                self._know(p)
            index = {p: bisect.bisect_left(self._parents, p) for p in set(parents)}
            self._check(index)
            self._given.update(index)
            self.samples.extend(Sample(o, index[p]) for o, p in zip(keep, parents, strict=True))

    def _check(self, index: dict[str, int]) -> None:
        for p, i in index.items():
            if self._given.get(p, i) != i:
                raise StoreError(
                    f"class {p!r} was given label {self._given[p]}, now {i}: the listing "
                    "broke its order promise"
                )

    def finish(self) -> Dataset:
        """The whole dataset; the same as :func:`build_dataset` over the whole listing."""
        classes = _folder_classes(tuple(self._parents)) if self._labels == "folder" else ()
        self._check({p: i for i, p in enumerate(classes)})
        objects = ObjectList.of(s.obj for s in self.samples)
        return Dataset(SampleList(objects, [s.label for s in self.samples]), classes)
