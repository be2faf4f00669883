"""Each sample's pixel size, for aspect-ratio buckets: from the metadata file's ``width``
and ``height`` columns where it has them, else from the image's header — one small range
read per object (the first :data:`HEAD_BYTES`; a JPEG whose frame header lies further, behind
a large EXIF block, is read again to :data:`HEAD_MAX`) — done once per node and kept in the
cache folder beside the saved listing (``listings/<digest>.sizes.npz``, each size with its
object's ETag), so later runs and ``warm`` read no header again.

An image whose header cannot be read — missing, corrupt, or replaced since it was listed —
stops the run at its start, naming it; under ``on_error="skip"`` it keeps an unknown size
(:data:`UNKNOWN`, never saved) instead, and fails when its batch reads it, as any bad image
does: a counted skip, each epoch.  A fault the store's retries could not get past (a
throttled or unreachable store) stops the run either way: it is not the image's.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from .._base._buckets import Buckets
from .._base._errors import (
    AsyncLoaderError,
    DecodeError,
    IntegrityError,
    ObjectNotFound,
    shown_key,
)
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore
from ._labels import Dataset
from ._saved import ListingTurn, listing_path, make_listings_folder

__all__ = [
    "HEAD_BYTES",
    "UNKNOWN",
    "bucket_index",
    "header_size",
    "keep_sizes",
    "sample_sizes",
    "sizes_path",
]

HEAD_BYTES = 64 * 1024
"""Bytes of an object read for its header: a JPEG's frame header, a PNG's IHDR, a WebP's."""
HEAD_MAX = 1024 * 1024
"""Bytes read, at most, for a header beyond :data:`HEAD_BYTES` (a JPEG's EXIF thumbnail)."""
log = logging.getLogger("asyncloader")

_INFLIGHT = 64
UNKNOWN = (0, 0)
"""The recorded ``(height, width)`` of an image whose header could not be read, under
``on_error="skip"``."""
_THE_IMAGE_S = (ObjectNotFound, IntegrityError, DecodeError)
"""The header read's failures that are the image's own: the ones ``"skip"`` counts."""


def sizes_path(directory: str | os.PathLike[str], url: str) -> Path:
    """Where the sizes of ``url``'s images are kept in the cache folder ``directory``."""
    return listing_path(directory, url).with_suffix(".sizes.npz")


def header_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(height, width)`` from the first bytes of an image, or None where they do not
    reach its header (or it is not an image Pillow reads)."""
    try:
        with Image.open(io.BytesIO(bytes(data))) as img:
            width, height = img.size
    except Exception:  # a truncated header, or not an image: the caller reads more, or fails
        return None
    return (height, width) if width > 0 and height > 0 else None


def _load(path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    try:
        with np.load(path, allow_pickle=False) as doc:
            keys = doc["keys"].tolist()
            etags = doc["etags"].tolist()
            hw = doc["sizes"].tolist()
    except (OSError, ValueError, KeyError, EOFError):
        return {}
    return {(k, e): (int(h), int(w)) for k, e, (h, w) in zip(keys, etags, hw, strict=True)}


def _save(path: Path, known: dict[tuple[str, str], tuple[int, int]]) -> None:
    make_listings_folder(path)
    items = sorted(known.items())
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(
            f,
            keys=np.array([k for (k, _), _ in items], dtype=str),
            etags=np.array([e for (_, e), _ in items], dtype=str),
            sizes=np.array([hw for _, hw in items], dtype=np.int64).reshape(-1, 2),
        )
    os.replace(tmp, path)


async def _read_header(
    store: ObjectStore, obj: ObjectInfo, counters: Counters | None
) -> tuple[int, int]:
    end = HEAD_BYTES
    while True:
        want = end if obj.size < 0 else min(end, obj.size)
        data = await store.get(obj.key, start=0, end=want, etag=obj.etag)
        if counters is not None:
            counters.requests += 1
            counters.bytes_fetched += len(data)
        size = header_size(data)
        if size is not None:
            return size
        if want < end or end >= HEAD_MAX:  # the whole object, or as far as a header goes
            raise DecodeError(
                f"{shown_key(obj.key)}: no image size in its first {len(data)} bytes "
                "(not an image Pillow reads?); aspect-ratio buckets need each image's size",
                key=obj.key,
            )
        end = HEAD_MAX


async def sample_sizes(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    known: Sequence[tuple[int, int] | None],
    *,
    folder: str | None,
    counters: Counters | None = None,
    skip: bool = False,
) -> npt.NDArray[np.int64]:
    """``(height, width)`` of each of ``objects`` (a dataset's samples): ``known[i]`` where
    given (the metadata file's), else kept in ``folder`` for that object's ETag, else read
    from its header; the sizes read are kept in ``folder`` for the next run, once per node
    (the loaders of a node take turns, as for the listing).  ``skip`` (``on_error="skip"``):
    an image whose header cannot be read for a fault of its own gets :data:`UNKNOWN`.

    Raises:
        DecodeError: an object whose header gives no size; StoreError: one that could not
            be read (``skip``: only a fault that is not the image's own).
    """
    out = np.zeros((len(objects), 2), dtype=np.int64)
    todo = [i for i, k in enumerate(known) if k is None]
    for i, k in enumerate(known):
        if k is not None:
            out[i] = k
    if not todo:
        return out
    path = sizes_path(folder, store.url) if folder is not None else None
    unreadable: dict[int, AsyncLoaderError] = {}
    turn = ListingTurn(path.with_suffix(".lock")) if path is not None else None
    if turn is not None:
        await turn.acquire()
    try:
        kept = await asyncio.to_thread(_load, path) if path is not None else {}
        missing = [i for i in todo if (objects[i].key, objects[i].etag) not in kept]
        gate = asyncio.Semaphore(_INFLIGHT)

        async def one(i: int) -> None:
            async with gate:
                try:
                    size = await _read_header(store, objects[i], counters)
                except _THE_IMAGE_S as exc:  # every header is read, to name the first
                    unreadable[i] = exc
                    return
                kept[(objects[i].key, objects[i].etag)] = size

        if missing:
            async with asyncio.TaskGroup() as tg:
                for i in missing:
                    tg.create_task(one(i))
            if path is not None:
                await asyncio.to_thread(_save, path, kept)
    except* AsyncLoaderError as group:
        raise group.exceptions[0] from None
    finally:
        if turn is not None:
            turn.release()
    bad = sorted(unreadable)
    if bad and not skip:  # the first in the dataset's order, whichever failed first
        first = unreadable[bad[0]]
        if len(bad) > 1:
            first.add_note(
                f"asyncloader: {len(bad) - 1} more image(s) whose header could not be read"
            )
        raise first
    for i in todo:
        out[i] = kept.get((objects[i].key, objects[i].etag), UNKNOWN)
    if bad:
        log.warning(
            "asyncloader: %d image(s) whose header could not be read (%s%s): each is "
            "skipped when its batch reads it (on_error='skip')",
            len(bad),
            ", ".join(shown_key(objects[i].key) for i in bad[:3]),
            ", ..." if len(bad) > 3 else "",
        )
    return out


async def keep_sizes(url: str, folder: str, sizes: dict[tuple[str, str], tuple[int, int]]) -> None:
    """Add ``sizes`` (``(key, ETag)`` → ``(height, width)``: headers read some other way,
    by ``warm`` from the objects it fetched) to those kept for ``url`` in ``folder``."""
    if not sizes:
        return
    path = sizes_path(folder, url)
    turn = ListingTurn(path.with_suffix(".lock"))
    await turn.acquire()
    try:
        kept = await asyncio.to_thread(_load, path)
        kept.update(sizes)
        await asyncio.to_thread(_save, path, kept)
    finally:
        turn.release()


def bucket_index(dataset: Dataset, buckets: Buckets) -> npt.NDArray[np.int64]:
    """Each sample's aspect-ratio bucket: the nearest to its recorded size.

    Raises:
        ValueError: a dataset without its samples' sizes (a bug: a bucketed run asks for
            them).
    """
    if dataset.sizes is None:
        raise ValueError("a bucketed run needs each sample's size")
    sizes = dataset.sizes
    # An image of UNKNOWN size goes to the bucket nearest a square: it fails when read.
    known = (sizes > 0).all(axis=1)
    out = np.full(len(sizes), buckets.nearest([1], [1])[0], dtype=np.int64)
    out[known] = buckets.nearest(sizes[known, 0], sizes[known, 1])
    return out


def metadata_sizes(
    file_names: Sequence[str], columns: dict[str, list[Any]], keys: Sequence[str]
) -> list[tuple[int, int] | None]:
    """Each key's ``(height, width)`` from a metadata file's ``width`` and ``height``
    columns (whole positive numbers; text that is one counts), None where it has none."""
    widths, heights = columns.get("width"), columns.get("height")
    if widths is None or heights is None:
        return [None] * len(keys)
    row_of = {name: r for r, name in enumerate(file_names)}
    out: list[tuple[int, int] | None] = []
    for key in keys:
        r = row_of.get(key)
        out.append(None if r is None else _pair(heights[r], widths[r]))
    return out


def _pair(height: object, width: object) -> tuple[int, int] | None:
    try:
        h, w = float(height), float(width)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if h <= 0 or w <= 0 or not h.is_integer() or not w.is_integer():
        return None
    return int(h), int(w)
