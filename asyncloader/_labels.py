"""From a listing to the dataset: which objects are samples, and their integer labels.

* ``"folder"`` — the ImageFolder convention: the label of ``cat/001.jpg`` is the index of
  ``cat`` among the sorted names of the folders holding images (``classes``).
* a manifest (``.jsonl`` lines ``{"key": ..., "label": ...}`` or ``.csv`` with a
  ``key,label`` header): the manifest names the samples and their labels, in its order.
  Labels that are not integers are mapped to the index of their sorted distinct values.
* a callable ``key -> int``.
* ``None`` — every label is -1.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ._manifest import read_manifest
from ._types import ObjectInfo, Sample

__all__ = ["IMAGE_EXTENSIONS", "Dataset", "build_dataset", "parse_manifest"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")

LabelSpec = str | Callable[[str], int] | None


@dataclass(frozen=True, slots=True)
class Dataset:
    """The samples of one run, in canonical order, and the class names (may be empty)."""

    samples: tuple[Sample, ...]
    classes: tuple[str, ...]


def parse_manifest(data: bytes | bytearray, name: str) -> list[tuple[str, str]]:
    """Parse a JSONL or CSV manifest into ``(key, label)`` pairs (label as text; -1: none).

    Raises:
        ValueError: a malformed line, naming the manifest and line number.
    """
    return [(row["key"], row.get("label", "-1")) for row in read_manifest(data, name)]


def _label_index(values: Sequence[str]) -> tuple[list[int], tuple[str, ...]]:
    try:
        return [int(v) for v in values], ()
    except ValueError:
        classes = tuple(sorted(set(values)))
        index = {c: i for i, c in enumerate(classes)}
        return [index[v] for v in values], classes


def build_dataset(
    objects: Iterable[ObjectInfo],
    labels: LabelSpec,
    *,
    extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
    manifest: list[tuple[str, str]] | None = None,
) -> Dataset:
    """Turn a listing into the dataset.

    Args:
        objects: The listing (any order).
        labels: ``"folder"``, a callable, or ``None``; ignored when ``manifest`` is given.
        extensions: Keep keys ending with one of these (case-insensitive); None keeps all.
        manifest: Parsed manifest rows; keys it names that the listing lacks are kept (with
            unknown size), so the run reports them as missing instead of silently dropping.
    """
    listed = {o.key: o for o in objects}
    if manifest is not None:
        values = [label for _, label in manifest]
        idx, classes = _label_index(values)
        samples = tuple(
            Sample(listed.get(key) or ObjectInfo(key, -1, ""), i)
            for (key, _), i in zip(manifest, idx, strict=True)
        )
        return Dataset(samples, classes)
    exts = tuple(e.lower() for e in extensions) if extensions is not None else None
    keys = sorted(k for k in listed if exts is None or k.lower().endswith(exts))
    if labels == "folder":
        parents = [posixpath.dirname(k) for k in keys]
        classes = tuple(sorted(set(parents)))
        index = {c: i for i, c in enumerate(classes)}
        return Dataset(
            tuple(Sample(listed[k], index[p]) for k, p in zip(keys, parents, strict=True)),
            classes,
        )
    if labels is None:
        return Dataset(tuple(Sample(listed[k], -1) for k in keys), ())
    if callable(labels):
        return Dataset(tuple(Sample(listed[k], int(labels(k))) for k in keys), ())
    raise ValueError(f"labels must be 'folder', a manifest, a callable or None, not {labels!r}")
