"""Manifest files: JSONL or CSV rows naming objects (a leaf module, pure parsing).

JSONL: one object per line, ``{"key": ..., "label": ..., "size": ..., "etag": ...}``.
CSV: a header naming the columns, ``key`` first among them.  Only ``key`` is required.

And the metadata files of Hugging Face's ``imagefolder`` (:data:`METADATA_NAMES`), whose
rows name images by ``file_name``: :func:`metadata_rows` reads their rows, for the dataset's
columns (``asyncloader._dataset._metadata``) and for a web folder's object list (a web
server has no listing: its metadata file names the images).
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
from typing import Any

__all__ = [
    "METADATA_NAMES",
    "file_key",
    "is_columnar",
    "is_manifest",
    "metadata_rows",
    "normalize_etag",
    "read_manifest",
]

METADATA_NAMES = ("metadata.jsonl", "metadata.csv", "metadata.parquet")
"""The metadata files looked for at a source's root, in this order."""

# A JSON value that does not become text by itself (true, false, null, a list or object
# inside a row); a string that merely looks so only sends the file the slower way.
_NOT_TEXT = re.compile(r":\s*(?:true|false|null|\[|\{)")


def normalize_etag(value: str) -> str:
    """``W/"abc"`` or ``"abc"`` → ``abc``: ETags as listings report them (a manifest's
    too, where it was written from boto3's ``head_object``, which keeps the quotes)."""
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def is_manifest(labels: object) -> bool:
    """Whether ``labels`` names a manifest (``.jsonl``, ``.csv``, or columnar ``.npz``)."""
    return isinstance(labels, str) and labels.endswith((".jsonl", ".csv", ".npz"))


def is_columnar(labels: object) -> bool:
    """Whether ``labels`` names a columnar manifest (``.npz``: arrays, not rows)."""
    return isinstance(labels, str) and labels.endswith(".npz")


def _float_text(literal: str) -> str:
    return str(float(literal))  # as the line-by-line path writes it: "1.50" -> "1.5"


def read_manifest(data: bytes | bytearray, name: str) -> list[dict[str, str]]:
    """Parse a manifest into rows of text fields, each with a non-empty ``key``.

    ``name`` (a file name or URL) picks the format: ``.csv`` is CSV, anything else JSONL.

    Raises:
        ValueError: a malformed line or a missing key, naming the manifest and line number.
    """
    text = data.decode("utf-8-sig")
    rows: list[dict[str, str]] = []
    if name.endswith(".csv"):
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or "key" not in reader.fieldnames:
            raise ValueError(f"{name}: a CSV manifest needs a header with 'key' (and 'label')")
        for lineno, row in enumerate(reader, start=2):
            if not row.get("key"):
                raise ValueError(f"{name}:{lineno}: empty key")
            rows.append({k: v for k, v in row.items() if k and v})
        return rows
    if not _NOT_TEXT.search(text):
        # Every value a string or a number: the whole file in one call, numbers read as
        # their text (a million rows in ~1 s, not ~4).
        try:
            body = text.strip()
            if "\r" in body or "\n\n" in body:  # blank lines, CRLF: line by line
                body = ",".join(line for line in text.splitlines() if line.strip())
            else:
                body = body.replace("\n", ",")
            parsed = json.loads("[" + body + "]", parse_int=str, parse_float=_float_text)
            if all(type(obj) is dict and obj.get("key") for obj in parsed):
                return parsed  # type: ignore[no-any-return]
        except ValueError:
            pass
    # A bad line somewhere (or values that are not text): line by line, to name it.
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            row = {str(k): str(v) for k, v in obj.items() if v is not None}
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"{name}:{lineno}: expected a JSON object per line") from exc
        if not row.get("key"):
            raise ValueError(f"{name}:{lineno}: expected {{'key': ..., 'label': ...}}")
        rows.append(row)
    return rows


def file_key(file_name: str) -> str:
    """A metadata row's ``file_name`` as the key it names (relative to the root, POSIX)."""
    return posixpath.normpath(file_name.lstrip("/"))


def metadata_rows(data: bytes | bytearray, name: str) -> list[tuple[int, dict[str, Any]]]:
    """The rows of a metadata file, each with its line (a Parquet file's row, from 1):
    ``metadata.jsonl`` (values keep their JSON types), ``metadata.csv`` (text; an empty
    field is ``None``; the header must name ``file_name``) or ``metadata.parquet`` (values
    as pyarrow gives them in Python: numbers, text, lists; null is ``None``).

    Raises:
        ValueError: a malformed line, a header or table without ``file_name``; naming the
            file and line.
        ImportError: a Parquet file without pyarrow installed, saying how to install it.
    """
    if name.endswith(".parquet"):
        return _parquet_rows(data, name)
    try:
        text = bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    rows: list[tuple[int, dict[str, Any]]] = []
    if name.endswith(".csv"):
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or "file_name" not in reader.fieldnames:
            raise ValueError(f"{name}: the header needs a 'file_name' column")
        for lineno, row in enumerate(reader, start=2):
            rows.append((lineno, {k: (v if v != "" else None) for k, v in row.items() if k}))
        return rows
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{name}:{lineno}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name}:{lineno}: expected a JSON object per line")
        rows.append((lineno, obj))
    return rows


def _parquet_rows(data: bytes | bytearray, name: str) -> list[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"{name} is read with pyarrow, which is not installed: "
            "pip install 'asyncloader[parquet]'"
        ) from None
    try:
        table = pq.read_table(pa.BufferReader(bytes(data)))
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{name}: not a Parquet file ({exc})") from None
    if "file_name" not in table.column_names:
        raise ValueError(f"{name}: the table needs a 'file_name' column")
    return list(enumerate(table.to_pylist(), start=1))
