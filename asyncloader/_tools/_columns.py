"""What a folder's metadata files hold, for ``asyncloader ls`` (pure): their rows, each
column's kind and range — what ``extras=``, a labels column and ``filters=`` can name, and
what a filter's value must be compared with — and how the images they name meet the
listing's: named but not there (each reported missing when a run reads it), there but not
named (a run leaves it out)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._base._filters import HEADER_COLUMNS, LISTING_COLUMNS, as_number
from .._dataset._metadata import Metadata, some_names

__all__ = ["MetadataReport", "describe_column", "metadata_report"]

SHOWN = 5
"""Names shown of those not listed, and distinct values shown of a column with few."""


@dataclass(frozen=True, slots=True)
class MetadataReport:
    """The metadata files of a folder, read as a loader reads them.

    Attributes:
        rows: Their rows together (one per image named).
        listed: The rows that name an image the listing has (the samples of a run).
        columns: Each column, in the files' order → its values in words: their kind, range
            or distinct values, and how many rows have none (``None``: a null, an empty CSV
            field, a missing key, or a file without the column).
        not_listed: How many names (of images, as a loader's extensions take them) the
            listing has no object for; ``not_listed_names`` the first of them, by key.
        unnamed: Images listed that no file names (a loader leaves them out).
    """

    rows: int
    listed: int = 0
    columns: dict[str, str] = field(default_factory=dict)
    not_listed: int = 0
    not_listed_names: list[str] = field(default_factory=list)
    unnamed: int = 0

    def lines(self) -> list[str]:
        """A few human lines, as ``ls`` prints them under the metadata files' line."""
        head = f"  rows: {self.rows:,}; naming an image listed here: {self.listed:,}"
        if self.not_listed:
            shown = some_names(self.not_listed_names, SHOWN)
            head += f"; naming one not there: {self.not_listed:,} ({shown}: missing when read)"
        if self.unnamed:
            head += f"; images here no row names: {self.unnamed:,} (left out)"
        own = [c for c in (*LISTING_COLUMNS, *HEADER_COLUMNS) if c not in self.columns]
        read = [c for c in HEADER_COLUMNS if c in own]
        note = (
            f" ({' and '.join(read)} from each image's header: a small read each)" if read else ""
        )
        return [
            head,
            *(f"  column {name}: {what}" for name, what in self.columns.items()),
            f"  filters= also takes: {', '.join(own)}{note}",
        ]


def metadata_report(
    metadata: Metadata, listed: Collection[str], keep: Callable[[str], bool]
) -> MetadataReport:
    """The report of ``metadata`` against a listing: ``listed``, every key it has;
    ``keep``, whether a key is an image a loader takes (its extensions)."""
    named = set(metadata.file_names)
    images = [name for name in metadata.file_names if keep(name)]
    missing = [name for name in images if name not in listed]
    return MetadataReport(
        rows=len(metadata.file_names),
        listed=len(images) - len(missing),
        columns={name: describe_column(values) for name, values in metadata.columns.items()},
        not_listed=len(missing),
        not_listed_names=sorted(missing)[: SHOWN + 1],
        unnamed=sum(1 for key in listed if keep(key) and key not in named),
    )


def describe_column(values: Sequence[Any]) -> str:
    """A column's values in words: ``whole numbers 0 … 4``, ``numbers 0.5 … 9.75``,
    ``text, 1,000 distinct``, ``text: 'cat', 'dog'``, ``text of numbers 3 … 9`` (a CSV's:
    a filter compares them as numbers), ``true/false``, ``lists of 1 … 3``, ``objects``;
    ``mixed: …`` where kinds differ; ``, N empty`` where rows have no value."""
    present = [v for v in values if v is not None]
    empty = len(values) - len(present)
    tail = f", {empty:,} empty" if empty else ""
    if not present:
        return "empty" if values else "no rows"
    kinds = Counter(_kind(v) for v in present)
    if len(kinds) > 1:
        parts = ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common())
        return f"mixed: {parts}{tail}"
    kind = next(iter(kinds))
    if kind in ("whole numbers", "numbers"):
        finite = [v for v in present if math.isfinite(v)]
        span = f" {_num(min(finite))} … {_num(max(finite))}" if finite else ""
        return f"{kind}{span}{tail}"
    if kind == "text":
        numbers = _as_numbers(present)
        if numbers is not None:
            return f"text of numbers {_num(min(numbers))} … {_num(max(numbers))}{tail}"
        distinct = Counter(present)
        if len(distinct) <= SHOWN:
            shown = ", ".join(repr(v) for v in sorted(distinct))
            return f"text: {shown}{tail}"
        return f"text, {len(distinct):,} distinct{tail}"
    if kind == "lists":
        lengths = [len(v) for v in present]
        return f"lists of {min(lengths)} … {max(lengths)}{tail}"
    return f"{kind}{tail}"


def _kind(value: Any) -> str:
    """A value's kind, as :func:`describe_column` names it."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "whole numbers"
    if isinstance(value, float):
        return "numbers"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list | tuple):
        return "lists"
    if isinstance(value, dict):
        return "objects"
    return type(value).__name__


def _as_numbers(texts: Sequence[str]) -> list[float] | None:
    """Every text read as a finite number the way a filter reads it
    (:func:`~asyncloader._base._filters.as_number`), or None where one is not (a CSV's
    column of numbers is text)."""
    out = []
    for text in texts:
        number = as_number(text)
        if number is None or not math.isfinite(number):
            return None
        out.append(number)
    return out


def _num(value: float) -> str:
    """A number as short as it reads: ``4``, ``0.5``, ``1e+06``."""
    return f"{value:g}"
