"""Which samples pass ``filters=`` (:mod:`asyncloader._base._filters`): the columns a
filter names, gathered for the samples of a listing — the metadata file's, the listing's
own (``size``, ``file_name``), and the headers' ``width`` and ``height`` where the file has
none of the name.  Those are known only once the headers are read, and they are read only
for the samples the rest of the filter keeps: the filter is decided first without them
(:func:`header_columns`: their terms taken to hold), then again with them.  So is ``size``
where the listing has not asked it yet (a web server's folder,
:data:`~asyncloader._base._types.UNSIZED`): the samples kept without it are asked, and the
filter decided again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._base._filters import HEADER_COLUMNS, LISTING_COLUMNS, Normal, keep_mask
from .._base._types import UNSIZED
from ._metadata import Metadata
from ._objects import ObjectList

__all__ = ["header_columns", "metadata_rows", "passing", "size_test"]


def header_columns(filters: Normal | None, metadata: Metadata | None) -> frozenset[str]:
    """The columns ``filters`` names that come from the images' headers: ``width`` and
    ``height`` where the metadata file has none of the name."""
    if filters is None:
        return frozenset()
    named = {column for group in filters for column, _, _ in group}
    there = set(metadata.columns) if metadata is not None else set()
    return frozenset(named & set(HEADER_COLUMNS) - there)


def metadata_rows(metadata: Metadata, keys: Sequence[str]) -> list[int]:
    """Each key's row in the metadata file (-1: it has none)."""
    row_of = {name: r for r, name in enumerate(metadata.file_names)}
    return [row_of.get(k, -1) for k in keys]


def passing(
    objects: ObjectList,
    keys: list[str],
    rows: list[int] | None,
    metadata: Metadata | None,
    filters: Normal,
    sizes: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.bool_]:
    """Which samples (``objects``, their keys ``keys`` and metadata rows ``rows``) pass
    ``filters``: all of it where the headers' ``(height, width)`` ``sizes`` are given (and
    the objects' sizes known) or it names none of their columns, else every sample that
    may pass it once they are known (see the module's docstring).

    Raises:
        ValueError: a column there is not, naming those there are; a value that cannot be
            compared (see :func:`~asyncloader._base._filters.keep_mask`).
    """
    named = {column for group in filters for column, _, _ in group}
    there = set(metadata.columns if metadata is not None else ())
    own = set(LISTING_COLUMNS) - there
    headers = set(HEADER_COLUMNS) - there
    columns: dict[str, Sequence[Any]] = {}  # those the filters name: one list per column
    listed = objects.sizes()
    if "size" in named & own:
        columns["size"] = [s if s >= 0 else None for s in listed.tolist()]
    if "file_name" in named & own:
        columns["file_name"] = keys
    if sizes is not None:
        for name in named & headers:
            columns[name] = sizes[:, 1 if name == "width" else 0].tolist()
    table = "the listing (size, file_name; width, height from the headers)"
    known = [*LISTING_COLUMNS, *HEADER_COLUMNS]
    if metadata is not None:
        assert rows is not None
        for name in named & there:
            values = metadata.columns[name]
            columns[name] = [values[r] if r >= 0 else None for r in rows]
        table = f"{metadata.name} and the listing"
        known = [*metadata.columns, *sorted(own), *sorted(headers)]
    later = header_columns(filters, metadata) if sizes is None else frozenset()
    keep = keep_mask(filters, columns, len(keys), keys, table=table, known=known, later=later)
    unasked = np.flatnonzero((listed == UNSIZED) & ("size" in named & own))
    if len(unasked):  # kept where they may pass once their sizes are asked
        at = unasked.tolist()
        some = {name: [v[i] for i in at] for name, v in columns.items() if name != "size"}
        keep[unasked] = keep_mask(
            filters,
            some,
            len(at),
            [keys[i] for i in at],
            table=table,
            known=known,
            later=later | {"size"},
        )
    return keep


def size_test(
    objects: ObjectList, metadata: Metadata | None, filters: Normal
) -> Callable[[Sequence[str], Sequence[tuple[int, int]]], list[bool]]:
    """Which samples of some keys of ``objects`` (those the filter kept without the headers'
    columns) pass ``filters`` once their headers' ``(height, width)`` are known: what the
    header pass asks of each hand-over of images it read whole, so that the cache keeps
    only samples (``_headers.Stays``), decided for all of them at once.  A key not there
    does not pass, nor does any where a value the filter cannot compare (the filter
    applied to every sample afterwards names it)."""
    keys_of = objects.keys()
    at = {key: i for i, key in enumerate(keys_of)}
    rows = metadata_rows(metadata, keys_of) if metadata is not None else None

    def passes(keys: Sequence[str], sizes: Sequence[tuple[int, int]]) -> list[bool]:
        out = [False] * len(keys)
        known = [j for j, key in enumerate(keys) if key in at]
        if not known:
            return out
        take = np.array([at[keys[j]] for j in known], dtype=np.int64)
        row = None if rows is None else [rows[i] for i in take.tolist()]
        hw = np.array([sizes[j] for j in known], dtype=np.int64).reshape(-1, 2)
        try:
            mask = passing(objects.take(take), [keys[j] for j in known], row, metadata, filters, hw)
        except ValueError:
            return out
        for j, ok in zip(known, mask.tolist(), strict=True):
            out[j] = ok
        return out

    return passes
