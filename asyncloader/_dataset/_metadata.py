"""Metadata and captions beside the images (pure): what ``extras=`` and a labels column read.

Two conventions users keep their folders in:

* **Metadata files at the source's root and in its folders** — Hugging Face's
  ``imagefolder``: ``metadata.jsonl`` (a JSON object per line), ``metadata.csv`` (a header)
  or ``metadata.parquet`` (read with pyarrow: ``pip install asyncloader[parquet]``), each
  row naming an image by ``file_name``, relative to the folder the file is in, and giving it
  columns (``caption``, ``label``, …).  A large dataset keeps one per folder of images
  (``part-0001/metadata.jsonl``, …): every one listed is read, and their rows are one table
  (:func:`merge_metadata`; a column one file lacks is ``None`` for its rows).  With any,
  the images they name are the samples (an image none names is left out, counted; a name
  no object has is kept and reported missing when read, as a manifest's is);
  ``labels="label"`` takes the labels from a column.
* **Same-stem sidecar files** — img2dataset's "files" layout: ``x.txt`` and ``x.json``
  beside ``x.jpg``.  ``extras=("txt",)`` reads each image's ``.txt`` (``"json"``: its
  ``.json``, parsed); a missing one is ``None``.

``extras`` names are resolved once per dataset by :func:`resolve_extras`: ``"source"`` is the
URL of the sample's source; ``"seed"`` the sample's seed for the epoch (filled in per batch,
``_run/_extras.py``); a column of the metadata file is that column; any other name is a
sidecar's extension.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._base._buckets import CROP_TOP_LEFT, ORIGINAL_SIZE
from .._base._manifest import METADATA_NAMES, file_key, metadata_rows
from .._base._types import ObjectInfo
from ._objects import ObjectList

__all__ = [
    "METADATA_NAMES",
    "CROP_TOP_LEFT",
    "ORIGINAL_SIZE",
    "SEED",
    "SOURCE",
    "Extras",
    "Metadata",
    "find_metadata",
    "merge_metadata",
    "metadata_objects",
    "named_not_there",
    "some_names",
    "parse_sidecar",
    "sidecar_objects",
    "read_metadata",
    "resolve_extras",
]

SOURCE = "source"
"""The extra that names each sample's source (its URL)."""
SEED = "seed"
"""The extra that gives each sample's seed for the epoch (the loader's seed, the epoch and
the sample's place in the epoch's order: the one the built-in transforms draw from), filled
in per batch."""


@dataclass(frozen=True, slots=True)
class Metadata:
    """Metadata files' rows: the images they name (``file_name``, as keys relative to the
    root) and their other columns (``None`` where a row lacks one), in the files' order.
    ``name``: the file's key, or (several files) what messages call them."""

    name: str
    file_names: list[str]
    columns: dict[str, list[Any]]


def find_metadata(keys: Collection[str], folder: str = "") -> str | None:
    """The metadata file among the listed ``keys`` (a set or mapping: looked up, not
    scanned) in ``folder`` (``""``: the root; ``"a/b"``: that folder, not its subfolders),
    or None: the first of :data:`METADATA_NAMES` there, where a folder has several kinds."""
    at = f"{folder}/" if folder else ""
    return next((at + n for n in METADATA_NAMES if at + n in keys), None)


def sidecar_objects(
    listed: Iterable[ObjectInfo], images: Sequence[ObjectInfo], is_image: Callable[[str], bool]
) -> list[ObjectInfo]:
    """The same-stem sidecar files of ``images`` among ``listed`` (``x.txt`` and ``x.json``
    beside ``x.jpg``: any listed object of the image's key less its suffix and another
    suffix that ``is_image`` does not take, and not a metadata file), in the images' order:
    what ``warm`` fetches beside the images so that ``extras=("txt",)`` runs from the
    node's disk."""
    by_stem: dict[str, list[ObjectInfo]] = {}
    for obj in listed:
        if is_image(obj.key) or posixpath.basename(obj.key) in METADATA_NAMES:
            continue
        stem, suffix = posixpath.splitext(obj.key)
        if suffix:
            by_stem.setdefault(stem, []).append(obj)
    if not by_stem:
        return []
    return [s for image in images for s in by_stem.get(posixpath.splitext(image.key)[0], ())]


def metadata_objects(listed: ObjectList) -> list[ObjectInfo]:
    """The listed metadata files, one per folder that has any (:func:`find_metadata`: the
    first of :data:`METADATA_NAMES` there), with their sizes and ETags, ordered by key (the
    root's first): Hugging Face's ``imagefolder`` reads every one under the data folder."""
    keys = listed.keys()
    names = set(METADATA_NAMES)
    # One pass of a C-level suffix test over the keys; a basename only for those it passes.
    at = {
        k: i
        for i, k in enumerate(keys)
        if k.endswith(METADATA_NAMES) and posixpath.basename(k) in names
    }
    chosen = (find_metadata(at, posixpath.dirname(k)) for k in at)
    keys_found = sorted({k for k in chosen if k is not None}, key=lambda k: ("/" in k, k))
    return [listed[at[key]] for key in keys_found]


def read_metadata(data: bytes | bytearray, name: str) -> Metadata:
    """Parse ``metadata.jsonl`` (values keep their JSON types), ``metadata.csv`` (text;
    an empty field is ``None``) or ``metadata.parquet`` (values as pyarrow gives them in
    Python: numbers, text, lists; null is ``None``).  ``name``: the file's key: a file in
    a folder (``a/metadata.jsonl``) names images relative to that folder, and its
    ``file_names`` are given as keys relative to the root (``a/…``).

    Raises:
        ValueError: a malformed line, a row without ``file_name``, a name given twice;
            naming the file and line (a Parquet file's row counts from 1).
        ImportError: a Parquet file without pyarrow installed, saying how to install it.
    """
    return _named_rows(name, metadata_rows(data, name))


def _named_rows(name: str, rows: list[tuple[int, dict[str, Any]]]) -> Metadata:
    """The metadata of a file's ``rows`` (each with its line); ``name``, its key."""
    folder = posixpath.dirname(name)
    file_names: list[str] = []
    seen: set[str] = set()
    for lineno, row in rows:
        file_name = row.get("file_name")
        if not isinstance(file_name, str) or not file_name:
            raise ValueError(f"{name}:{lineno}: a row without its 'file_name'")
        file_name = file_key(f"{folder}/{file_name}" if folder else file_name)
        if file_name in seen:
            raise ValueError(f"{name}:{lineno}: {file_name!r} is named twice")
        seen.add(file_name)
        file_names.append(file_name)
    names = list(dict.fromkeys(k for _, row in rows for k in row if k != "file_name"))
    columns = {c: [row.get(c) for _, row in rows] for c in names}
    return Metadata(name, file_names, columns)


def some_names(names: Sequence[str], most: int = 3) -> str:
    """The first ``most`` of ``names``, comma-separated, and "…" where there are more: how
    messages name a dataset's metadata files."""
    return ", ".join(names[:most]) + (", …" if len(names) > most else "")


def merge_metadata(parts: Sequence[Metadata]) -> Metadata:
    """Several metadata files' rows as one table, in the order given: the columns of any of
    them, ``None`` in the rows of a file without that column.

    Raises:
        ValueError: an image named by two of the files, naming both.
    """
    if len(parts) == 1:
        return parts[0]
    named_in: dict[str, str] = {}
    for part in parts:
        for file_name in part.file_names:
            other = named_in.setdefault(file_name, part.name)
            if other != part.name:
                raise ValueError(f"{file_name!r} is named by both {other} and {part.name}")
    names = list(dict.fromkeys(c for part in parts for c in part.columns))
    columns: dict[str, list[Any]] = {c: [] for c in names}
    for part in parts:
        rows = len(part.file_names)
        for c in names:
            columns[c].extend(part.columns.get(c, [None] * rows))
    name = f"{len(parts)} metadata files ({some_names([p.name for p in parts])})"
    return Metadata(name, [f for part in parts for f in part.file_names], columns)


def named_not_there(
    files: Sequence[tuple[str, bytes]], listed: Iterable[ObjectInfo], keep: Callable[[str], bool]
) -> tuple[list[str], list[tuple[str, str]]]:
    """The images (keys that ``keep`` takes) that the metadata ``files`` — ``(key, bytes)``
    each — name and ``listed`` does not have, sorted: not listed, or listed with size -1
    (a web server's folder is listed from its metadata file, and a name whose HEAD found
    nothing is listed so).  Also ``(key, error)`` of each file that cannot be read as a
    run would read it (malformed; an image named by two files: under all the files'
    names), and the rest are still checked.  A Parquet file without pyarrow is not read
    here: a run's start says how to install it."""
    parts: list[Metadata] = []
    errors: list[tuple[str, str]] = []
    for key, data in files:
        try:
            parts.append(read_metadata(data, key))
        except ImportError:
            continue
        except ValueError as exc:
            errors.append((key, str(exc).splitlines()[0]))
    try:
        merge_metadata(parts)
    except ValueError as exc:  # the message names both files
        errors.append((some_names([p.name for p in parts]), str(exc)))
    named = {name for part in parts for name in part.file_names}
    there = {o.key for o in listed if o.size != -1}
    return sorted(n for n in named if keep(n) and n not in there), errors


@dataclass(frozen=True, slots=True)
class Extras:
    """What ``extras=`` asks for, per sample of a dataset (index = the sample's).

    Attributes:
        names: The extras, in the order asked.
        columns: Values known from the listing: metadata columns, the source.
        sidecars: Per sidecar extra, each sample's sidecar object (None: it has none).
        suffixes: Each sidecar extra's file suffix (``".txt"``).
    """

    names: tuple[str, ...]
    columns: dict[str, list[Any]]
    sidecars: dict[str, list[ObjectInfo | None]]
    suffixes: dict[str, str]

    def take(self, indices: Sequence[int]) -> Extras:
        """The extras of the samples ``indices`` (a subset or reordering)."""
        return Extras(
            self.names,
            {n: [v[i] for i in indices] for n, v in self.columns.items()},
            {n: [v[i] for i in indices] for n, v in self.sidecars.items()},
            self.suffixes,
        )


def _suffix(name: str) -> str:
    return "." + name.lstrip(".")


def resolve_extras(
    names: Sequence[str],
    samples: Sequence[str],
    listed: Mapping[str, ObjectInfo],
    *,
    source: str,
    metadata: Metadata | None,
    rows: Sequence[int] | None,
) -> Extras:
    """Each extra of ``names`` for the sample keys ``samples``.

    Args:
        names: As ``extras=`` gives them.
        samples: The samples' keys, in the dataset's order.
        listed: Every listed object by key (sidecars are found here, not requested).
        source: The URL of the samples' source.
        metadata: The metadata files' rows, if there are any.
        rows: For each sample, its row in ``metadata`` (-1: none).

    Raises:
        ValueError: a name that is neither the source, the seed, a column of the metadata
            file nor the suffix of any listed sidecar.
    """
    columns: dict[str, list[Any]] = {}
    sidecars: dict[str, list[ObjectInfo | None]] = {}
    suffixes: dict[str, str] = {}
    for name in names:
        if name in (SEED, ORIGINAL_SIZE, CROP_TOP_LEFT):
            continue  # per epoch or per bucket: the batch's reader fills it in
        if name == SOURCE:
            columns[name] = [source] * len(samples)
        elif metadata is not None and name in metadata.columns:
            assert rows is not None
            values = metadata.columns[name]
            columns[name] = [values[r] if r >= 0 else None for r in rows]
        else:
            suffix = _suffix(name)
            found = [listed.get(posixpath.splitext(key)[0] + suffix) for key in samples]
            if samples and not any(found) and not any(k.endswith(suffix) for k in listed):
                have = (
                    f"; the columns of {metadata.name}: {', '.join(metadata.columns)}"
                    if (metadata is not None)
                    else f"; no {', '.join(METADATA_NAMES)} at the root or in its folders"
                )
                raise ValueError(
                    f"extras: {name!r} is neither a metadata column nor a sidecar file "
                    f"(no object under {source} ends with {suffix!r}{have})"
                )
            sidecars[name] = found
            suffixes[name] = suffix
    return Extras(tuple(names), columns, sidecars, suffixes)


def parse_sidecar(data: bytes | bytearray | memoryview, suffix: str) -> Any:
    """A sidecar's value: ``.json`` parsed, anything else UTF-8 text.

    Raises:
        ValueError: not UTF-8, or not JSON.
    """
    try:
        text = bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if suffix == ".json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    return text
