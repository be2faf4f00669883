"""Filters over a dataset's columns, applied at listing time (pure): ``filters=``.

The form is pyarrow's (``pyarrow.parquet.read_table(filters=)``, Hugging Face's
``imagefolder`` ``filters=``), disjunctive normal form:

* a list of ``(column, op, value)`` tuples: all of them hold (AND);
* a list of such lists: any of them holds (OR of ANDs).

``op`` is one of ``=``/``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``, ``not in``
(``value`` a list, tuple or set for the last two).  The columns are the metadata
files' (``metadata.jsonl``/``.csv``/``.parquet``: the root's and its folders'), and the
listing's own where the files have no column of that name: ``size`` (the object's
bytes) and ``file_name`` (its key under the source); and ``width`` and ``height`` (the
image's pixels) where the files have none of the name, from each image's header: one
small range read per sample, and only for the samples that the rest of the filter keeps
(:func:`keep_mask`'s ``later``: the filter is decided without those terms first, then
again with them), kept beside the saved listing as a bucketed run's sizes are.

Missing values follow pyarrow: a sample without a value (its row lacks the column, or it
has no row, or its size is unknown) fails every comparison, ``!=`` included; ``in`` holds
for it only when the set holds ``None``, ``not in`` only when it does not.  A text value
compared with a number is read as a number (a CSV's fields are text: ``("aesthetic", ">=",
5)`` works on ``metadata.csv`` as on ``.jsonl``); text that is not a number there, or an
order asked between a number and text, is an error naming the column and the sample —
never a silent drop.

A filter is part of what a run's order is made of: :func:`describe` gives its canonical
text, kept in the resume state (another filter is another dataset).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "Filters",
    "HEADER_COLUMNS",
    "LISTING_COLUMNS",
    "as_number",
    "describe",
    "keep_mask",
    "normalize",
]

Filters = Sequence[Sequence[Any]] | Sequence[Sequence[Sequence[Any]]]
"""``filters=`` as a user gives it (see the module's docstring)."""

LISTING_COLUMNS = ("size", "file_name")
"""The listing's own columns, filterable where the metadata file has none of the name."""

HEADER_COLUMNS = ("width", "height")
"""The columns read from each image's header where the metadata file has none of the name
[pixels]."""

Term = tuple[str, str, Any]
Normal = tuple[tuple[Term, ...], ...]
"""Filters in canonical form: an OR of ANDs of ``(column, op, value)``, ``op`` as written in
:data:`_OPS` (``=`` is ``==``), a set's values as a sorted tuple."""

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_OPS = (*_ORDER, "in", "not in")


def _is_term(item: object) -> bool:
    return isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[0], str)


def _plain(value: object, where: str) -> Any:
    """``value`` if it is a scalar a metadata file can hold (text, a number, a bool, None)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    raise ValueError(f"filters: {where}: {value!r} is not text, a number, a bool or None")


def _term(item: Sequence[Any]) -> Term:
    column, op, value = item
    op = "==" if op == "=" else op
    where = f"({column!r}, {op!r}, …)"
    if op not in _OPS:
        raise ValueError(f"filters: {where}: the op must be one of {', '.join(_OPS)}")
    if op in ("in", "not in"):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
            raise ValueError(f"filters: {where}: {op!r} takes a list of values, not {value!r}")
        values = [_plain(v, where) for v in value]
        return column, op, tuple(sorted(set(values), key=lambda v: (repr(type(v)), v)))
    return column, op, _plain(value, where)


def normalize(filters: Filters | None) -> Normal | None:
    """``filters`` in canonical form, checked; None for none (None or an empty list).

    Raises:
        ValueError: not pyarrow's form, an unknown op, a set op without a list, a value
            that is not text, a number, a bool or None.
    """
    if filters is None or (isinstance(filters, (list, tuple)) and not filters):
        return None
    if isinstance(filters, (str, bytes)) or not isinstance(filters, (list, tuple)):
        raise ValueError(
            f"filters must be a list of (column, op, value) tuples, or a list of such "
            f"lists, not {filters!r}"
        )
    groups = [filters] if all(_is_term(t) for t in filters) else filters
    out = []
    for group in groups:
        if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple)) or not group:
            raise ValueError(
                f"filters: {group!r} is neither a (column, op, value) tuple nor a non-empty "
                "list of them"
            )
        if not all(_is_term(t) for t in group):
            bad = next(t for t in group if not _is_term(t))
            raise ValueError(f"filters: {bad!r} is not a (column, op, value) tuple")
        out.append(tuple(_term(t) for t in group))
    return tuple(out)


def describe(filters: Normal | None) -> str | None:
    """The canonical text of ``filters`` (JSON), for a resume state; None for none."""
    if filters is None:
        return None
    return json.dumps(
        [[[c, op, list(v) if op.endswith("in") else v] for c, op, v in g] for g in filters]
    )


def as_number(value: object) -> float | None:
    """``value`` as a number to compare with one (bools are not numbers here; text that
    reads as one is: a CSV's fields), or None where it is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _holds(value: Any, op: str, want: Any) -> bool | str:
    """Whether ``value`` (a sample's) passes ``op want``; a text, the reason, where the two
    cannot be compared."""
    if op in ("in", "not in"):
        if value is None:
            inside = None in want
        else:
            inside = any(_holds(value, "==", w) is True for w in want)
        return inside if op == "in" else not inside
    if value is None or want is None:
        return False  # null: fails every comparison (pyarrow's null is dropped)
    numeric = isinstance(want, (int, float)) and not isinstance(want, bool)
    if numeric or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        a, b = as_number(value), as_number(want)
        if a is None or b is None:
            if op in ("==", "!="):
                return op == "!="
            return f"{value!r} and {want!r} cannot be ordered (a number and text)"
        return _ORDER[op](a, b)
    if type(value) is not type(want) and not (isinstance(value, str) and isinstance(want, str)):
        if op in ("==", "!="):
            return op == "!="
        kinds = f"{type(value).__name__} and {type(want).__name__}"
        return f"{value!r} and {want!r} cannot be ordered ({kinds})"
    try:
        return _ORDER[op](value, want)
    except TypeError:
        return f"{value!r} and {want!r} cannot be ordered"


def keep_mask(
    filters: Normal,
    columns: Mapping[str, Sequence[Any]],
    n: int,
    names: Sequence[str],
    *,
    table: str,
    known: Sequence[str] | None = None,
    later: frozenset[str] = frozenset(),
) -> npt.NDArray[np.bool_]:
    """Which of ``n`` samples pass ``filters`` over their ``columns`` (each ``n`` values).

    Args:
        names: The samples' names, for errors.
        table: What the columns come from, for errors (``"metadata.jsonl and the listing"``).
        known: Every column there is, for errors, where ``columns`` holds only those the
            filters name (default: ``columns``'s).
        later: Columns not known yet (read later, for the samples kept now): their terms
            are taken to hold, so that the samples kept are every one that may pass; the
            filter is applied again once they are known.

    Raises:
        ValueError: a column no table has (naming those it has), or a value that cannot be
            compared with the filter's (naming the column and the sample).
    """
    for group in filters:
        for column, _, _ in group:
            if column not in columns and column not in later:
                there = ", ".join(columns if known is None else known)
                raise ValueError(f"filters: no column {column!r} in {table} (there: {there})")
    keep = np.zeros(n, dtype=bool)
    for group in filters:
        ok = np.ones(n, dtype=bool)
        for column, op, want in group:
            if column in later:
                continue
            values = columns[column]
            for i in np.flatnonzero(ok).tolist():
                held = _holds(values[i], op, want)
                if isinstance(held, str):
                    raise ValueError(f"filters: column {column!r} of {names[i]!r}: {held}")
                ok[i] = held
        keep |= ok
    return keep
