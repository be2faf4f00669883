"""Each sample's pixel size, for aspect-ratio buckets: from the metadata file's ``width``
and ``height`` columns where it has them, else from the image's header (``_headers``: in
the node's cache where it holds the image, else one small range read per object) — done
once per job, like the listing: the first process of the job to need them (a rank, a
DataLoader worker, the training process counting ``len()``) reads them, and every other
takes them from the job's store (:class:`JobShare`).  Each node keeps them in its cache
folder beside the saved listing (``listings/<digest>.sizes.npz``, each size with its
object's ETag), so later runs and ``warm`` read no header again; the sizes of the images
turned upright by their EXIF orientation (``DecodeConfig(exif_orientation=True)``) are
kept apart, in ``listings/<digest>.upright-sizes.npz``.  A web server's folder, whose
listing has no sizes, is sized by a GET of each image's first bytes that gives its header
too (:func:`asking_with_heads`): the sizes read then are kept there before the header
pass, which finds them.

An image whose header cannot be read — missing, corrupt, or replaced since it was listed —
stops the run at its start, naming it; under ``on_error="skip"`` it keeps an unknown size
(:data:`UNKNOWN`, never saved) instead, and fails when its batch reads it, as any bad image
does: a counted skip, each epoch.  A fault the store's retries could not get past (a
throttled or unreachable store) stops the run either way: it is not the image's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import threading
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .._base._buckets import Buckets
from .._base._errors import AsyncLoaderError, shown_key
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore
from ._headers import HEAD_BYTES, CachedHeads, Stays, read_headers
from ._labels import Dataset
from ._listing import Asking
from ._metadata import Metadata
from ._objects import ObjectList
from ._saved import ListingTurn, listing_path, make_listings_folder

__all__ = [
    "JobShare",
    "NO_SIZES",
    "SizeReading",
    "UNKNOWN",
    "asking_with_heads",
    "bucket_index",
    "keep_sizes",
    "sample_sizes",
    "share_name",
    "sizes_path",
    "unmarked",
    "with_sizes",
]

log = logging.getLogger("asyncloader")

UNKNOWN = (0, 0)
"""The recorded ``(height, width)`` of an image whose header could not be read, under
``on_error="skip"``."""


def sizes_path(directory: str | os.PathLike[str], url: str, upright: bool = False) -> Path:
    """Where the sizes of ``url``'s images are kept in the cache folder ``directory``
    (``upright``: turned upright by their EXIF orientation, a file of their own)."""
    return listing_path(directory, url).with_suffix(
        ".upright-sizes.npz" if upright else ".sizes.npz"
    )


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


class JobShare(Protocol):
    """What one process of a job makes and every other reads (the job's store:
    ``asyncloader._run._dist.StoreShare``): :meth:`take` is None in the process that is to
    make a name, which then :meth:`publish` es it or :meth:`fail` s (or, stopped before it
    finished without failing, :meth:`release` s it to a waiting process); in every other it
    waits for the bytes published and returns them.  Every call may block (a round trip;
    :meth:`take` until the bytes are there)."""

    def take(self, name: str, what: str, doing: str) -> bytes | None: ...

    def publish(self, name: str, data: bytes) -> None: ...

    def fail(self, name: str, error: BaseException) -> None: ...

    def release(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class SizeReading:
    """How a run reads its images' sizes, where it needs them (aspect-ratio buckets, a
    filter on ``width``/``height``) and the metadata file has none.

    Attributes:
        wanted: Each sample's size is kept with the dataset (a bucketed run); else the
            sizes are read only for a size filter, and dropped after it.
        skip: ``on_error="skip"``: an image whose header cannot be read for a fault of its
            own gets :data:`UNKNOWN` (it fails, and is counted, when read).
        share: The job's (:class:`JobShare`): one process of the job reads the headers,
            every other takes the sizes it found; None: this process reads its own.
        cached: The node's cache (:class:`CachedHeads`): the headers of the objects it
            holds are read there, not from the store; None: no cache.
        upright: The sizes of the images turned upright by their EXIF orientation
            (``DecodeConfig(exif_orientation=True)``), kept apart from the stored ones.
    """

    wanted: bool = False
    skip: bool = False
    share: JobShare | None = None
    cached: CachedHeads | None = None
    upright: bool = False


NO_SIZES = SizeReading()
"""A run that keeps no sizes (a size filter still reads them, each process its own)."""


async def with_sizes(
    store: ObjectStore,
    dataset: Dataset,
    metadata: Metadata | None,
    folder: str | None,
    counters: Counters | None,
    reading: SizeReading = NO_SIZES,
    *,
    stays: Stays | None = None,
) -> Dataset:
    """``dataset`` with each sample's pixel size: the metadata file's ``width`` and
    ``height`` where it gives them, else its header's (:func:`sample_sizes`, read as
    ``reading`` says).  ``stays``: which samples stay ones once their size is known
    (:func:`._headers.every_one` where no filter on the sizes follows): the images of those
    that their header's read fetched whole are worth caching."""
    objects = dataset.samples.objects
    keys = objects.keys()
    known: list[tuple[int, int] | None] = (
        metadata_sizes(metadata.file_names, metadata.columns, keys)
        if metadata is not None
        else [None] * len(keys)
    )
    pixels = await sample_sizes(
        store,
        objects,
        known,
        folder=folder,
        counters=counters,
        skip=reading.skip,
        share=reading.share,
        cached=reading.cached,
        stays=stays,
        upright=reading.upright,
    )
    return dataclasses.replace(dataset, sizes=pixels)


async def sample_sizes(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    known: Sequence[tuple[int, int] | None],
    *,
    folder: str | None,
    counters: Counters | None = None,
    skip: bool = False,
    share: JobShare | None = None,
    cached: CachedHeads | None = None,
    stays: Stays | None = None,
    upright: bool = False,
) -> npt.NDArray[np.int64]:
    """``(height, width)`` of each of ``objects`` (a dataset's samples): ``known[i]`` where
    given (the metadata file's), else kept in ``folder`` for that object's ETag, else read
    from its header (in the node's cache, ``cached``, where it holds the object, else in
    the store); the sizes read are kept in ``folder`` for the next run, once per node
    (the loaders of a node take turns, as for the listing).  ``share``: the job's, so that
    one process of the job finds the sizes (from its folder, else the headers) and every
    other takes them from it, keeping them in its own folder too.  ``skip``
    (``on_error="skip"``): an image whose header cannot be read for a fault of its own gets
    :data:`UNKNOWN`.  ``stays``: which of ``objects`` stay samples of the run once their
    sizes are known (:data:`._headers.Stays`): those of them that their header's read
    fetched whole are kept in the node's cache (``cached``), for the first epoch to read
    there; None: none is kept.  ``upright``: the
    headers' sizes of the images turned upright by their EXIF orientation (the metadata
    file's are taken as they are).

    Raises:
        DecodeError: an object whose header gives no size; StoreError: one that could not
            be read (``skip``: only a fault that is not the image's own).
        AsyncLoaderError: the process of the job that read them failed (``share``).
    """
    out = np.zeros((len(objects), 2), dtype=np.int64)
    todo = [i for i, k in enumerate(known) if k is None]
    for i, k in enumerate(known):
        if k is not None:
            out[i] = k
    if not todo:
        return out
    # As arrays, not an ObjectInfo each (a million of them): the share digests them too.
    wanted = ObjectList.of(objects).take(np.asarray(todo, dtype=np.int64))
    how = _How(skip, cached, stays, upright)
    if share is None:
        found = await _found_sizes(store, wanted, folder, counters, how)
    else:
        found = await _shared_sizes(store, wanted, folder, counters, share, how)
    out[todo] = found
    bad = [i for i, hw in zip(todo, found.tolist(), strict=True) if tuple(hw) == UNKNOWN]
    if bad:
        log.warning(
            "asyncloader: %d image(s) whose header could not be read (%s%s): each is "
            "skipped when its batch reads it (on_error='skip')",
            len(bad),
            ", ".join(shown_key(objects[i].key) for i in bad[:3]),
            ", ..." if len(bad) > 3 else "",
        )
    return out


@dataclass(frozen=True, slots=True)
class _How:
    """How :func:`sample_sizes` reads the headers (its arguments of those names)."""

    skip: bool
    cached: CachedHeads | None
    stays: Stays | None
    upright: bool


async def _shared_sizes(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    folder: str | None,
    counters: Counters | None,
    share: JobShare,
    how: _How,
) -> npt.NDArray[np.int64]:
    """:func:`_found_sizes` in the first process of the job to need these objects' sizes;
    in every other, what it found (kept in this process's folder too)."""
    listed = ObjectList.of(objects)
    name = share_name(store.url, listed, how.skip, how.upright)
    what = f"image sizes of {store.url}"
    data = await asyncio.to_thread(share.take, name, what, f"read the {what}")
    if data is None:  # this process reads them
        try:
            found = await _found_sizes(store, objects, folder, counters, how)
        except Exception as exc:
            await asyncio.to_thread(share.fail, name, exc)
            raise
        except BaseException:  # cancelled (its loader closed), interrupted: not a failure
            await asyncio.to_thread(share.release, name)
            raise
        await asyncio.to_thread(share.publish, name, _encode_sizes(found))
        return found
    found = _decode_sizes(data, len(objects))
    if folder is not None:  # this node's next run reads none either
        keys, _, etags = listed.columns()
        got = zip(keys, etags, found.tolist(), strict=True)
        sizes = {(k, e): (h, w) for k, e, (h, w) in got if (h, w) != UNKNOWN}
        await keep_sizes(store.url, folder, sizes, upright=how.upright)
    return found


def share_name(url: str, objects: ObjectList, skip: bool, upright: bool = False) -> str:
    """The name in the job's store of the sizes of ``objects`` of ``url`` (read with
    ``skip`` or without: an unreadable image is unknown, or fails them; ``upright`` or
    as stored)."""
    doc = f"{url}\0{int(skip)}\0{objects.digest()}" + ("\0upright" if upright else "")
    return "sizes/" + hashlib.sha256(doc.encode()).hexdigest()[:32]


def _encode_sizes(sizes: npt.NDArray[np.int64]) -> bytes:
    return zlib.compress(sizes.astype("<i4").tobytes(), 1)


def _decode_sizes(data: bytes, n: int) -> npt.NDArray[np.int64]:
    flat = np.frombuffer(zlib.decompress(data), dtype="<i4")
    if flat.size != 2 * n:
        raise AsyncLoaderError(f"the job's store holds {flat.size // 2} image sizes, not {n}")
    return flat.astype(np.int64).reshape(n, 2)


async def _found_sizes(
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    folder: str | None,
    counters: Counters | None,
    how: _How,
) -> npt.NDArray[np.int64]:
    """Each of ``objects``'s ``(height, width)``: kept in ``folder`` for its ETag, else
    read from its header — in the node's cache (``cached``) where it holds the object, else
    in the store — (and kept there); :data:`UNKNOWN` where it cannot be read, under
    ``how.skip``.  ``how.stays`` and ``how.upright``: as :func:`._headers.read_headers`
    takes them.

    Raises:
        As :func:`sample_sizes` (without ``skip``: the first unreadable image in order).
    """
    path = sizes_path(folder, store.url, how.upright) if folder is not None else None
    unreadable: dict[int, AsyncLoaderError] = {}
    turn = ListingTurn(path.with_suffix(".lock")) if path is not None else None
    if turn is not None:
        await turn.acquire()
    try:
        kept = await asyncio.to_thread(_load, path) if path is not None else {}
        missing = [i for i, o in enumerate(objects) if (o.key, o.etag) not in kept]
        if missing:
            todo = [objects[i] for i in missing]
            found, failed = await read_headers(
                store, todo, counters, how.cached, stays=how.stays, upright=how.upright
            )
            for j, size in found.items():
                kept[(todo[j].key, todo[j].etag)] = size
            unreadable = {missing[j]: exc for j, exc in failed.items()}
            if path is not None:
                await asyncio.to_thread(_save, path, kept)
    finally:
        if turn is not None:
            turn.release()
    bad = sorted(unreadable)
    if bad and not how.skip:  # the first in the dataset's order, whichever failed first
        first = unreadable[bad[0]]
        if len(bad) > 1:
            first.add_note(
                f"asyncloader: {len(bad) - 1} more image(s) whose header could not be read"
            )
        raise first
    hw = [kept.get((o.key, o.etag), UNKNOWN) for o in objects]
    return np.array(hw, dtype=np.int64).reshape(len(objects), 2)


async def keep_sizes(
    url: str,
    folder: str,
    sizes: dict[tuple[str, str], tuple[int, int]],
    *,
    upright: bool = False,
) -> None:
    """Add ``sizes`` (``(key, ETag)`` → ``(height, width)``: headers read some other way,
    by ``warm`` from the objects it fetched; ``upright`` or as stored) to those kept for
    ``url`` in ``folder``."""
    if not sizes:
        return
    path = sizes_path(folder, url, upright)
    turn = ListingTurn(path.with_suffix(".lock"))
    await turn.acquire()
    try:
        kept = await asyncio.to_thread(_load, path)
        if any(kept.get(k) != hw for k, hw in sizes.items()):  # else kept already
            kept.update(sizes)
            await asyncio.to_thread(_save, path, kept)
    finally:
        turn.release()


def bucket_index(dataset: Dataset, buckets: Buckets) -> npt.NDArray[np.int64]:
    """Each sample's aspect-ratio bucket: the nearest to its recorded size.

    An image of :data:`UNKNOWN` size (its header unreadable, under ``on_error="skip"``)
    fails when its batch reads it.  It is marked ``~k`` (negative), ``k`` the bucket most
    of the images of known size go to (the one nearest a square where none is known), and
    joins that bucket first each epoch (:func:`~asyncloader._run._sampler.bucketed`): so
    it is read, and counted as skipped, every epoch, not left over by a bucket that would
    fill no batch with it.  :func:`unmarked` gives each sample's bucket either way.

    Raises:
        ValueError: a dataset without its samples' sizes (a bug: a bucketed run asks for
            them).
    """
    if dataset.sizes is None:
        raise ValueError("a bucketed run needs each sample's size")
    sizes = dataset.sizes
    known = (sizes > 0).all(axis=1)
    out = np.zeros(len(sizes), dtype=np.int64)
    out[known] = buckets.nearest(sizes[known, 0], sizes[known, 1])
    if not known.all():
        fullest = np.bincount(out[known], minlength=len(buckets.sizes)).argmax()
        out[~known] = ~(fullest if known.any() else buckets.nearest([1], [1])[0])
    return out


def unmarked(marked: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each sample's bucket from :func:`bucket_index`'s marks (``~k`` is bucket ``k``)."""
    return np.where(marked >= 0, marked, ~marked)


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


_HEADS_FIRST, _HEADS_MOST = 64, 512
"""Images of a web server's folder sized at once by a GET of their first bytes (their bytes
held until their headers are read): the first round's count, the most in one round."""
_HELD = 32 * 1024 * 1024
"""The bytes a round of those GETs is to hold: the next round's count is scaled to it (a
server that ignores ranges sends whole images; the first round holds what the header
pass's readers would)."""


def asking_with_heads(
    store: ObjectStore,
    folder: str | None,
    counters: Counters | None,
    reading: SizeReading,
    images: Collection[str],
    stays: Stays | None,
) -> Asking | None:
    """How a run that reads its images' headers next (:func:`with_sizes`, as ``reading``
    says) asks the sizes that a web server's folder lists without
    (:func:`._listing.complete_sizes`): where the store answers a GET of an image's first
    bytes with its size and ETag (``stat_listed_heads``), those of ``images`` are asked
    that way and their headers read from those bytes at once (``stays``: as
    :func:`._headers.read_headers` takes it; the images read whole are kept in the cache
    only where all of them would fill at most half of it, as estimated while they are
    sized), the sizes found kept in ``folder`` where
    :func:`with_sizes` finds them: one request an image where a HEAD and a header read
    made two.  The other keys (metadata files, sidecars) are asked as ``stat_listed``
    asks them.  None where the store cannot, or there is no folder to keep the sizes in
    (the caller asks as it would without this)."""
    heads = getattr(store, "stat_listed_heads", None)
    stat_listed = getattr(store, "stat_listed", None)
    if heads is None or stat_listed is None or folder is None:
        return None

    limit = reading.cached.size_limit if reading.cached is not None else 0

    async def ask(names: Sequence[str]) -> list[ObjectInfo]:
        out: dict[str, ObjectInfo] = {}
        rest = [n for n in names if n not in images]
        if rest:
            out.update((o.key, o) for o in await stat_listed(rest))
        pictures = [n for n in names if n in images]
        count, total = 0, 0  # images sized so far, their bytes
        sizes: dict[tuple[str, str], tuple[int, int]] = {}
        at, step = 0, _HEADS_FIRST
        while at < len(pictures):
            got = await heads(pictures[at : at + step], HEAD_BYTES)
            at += step
            there = [o for o, _ in got if o.size >= 0]  # the rest: missing, named when read
            held = {o.key: bytes(data) for o, data in got if o.size >= 0}
            count, total = count + len(there), total + sum(o.size for o in there)
            step = max(16, min(_HEADS_MOST, step * _HELD // max(1, sum(map(len, held.values())))))
            # The images read whole are kept where all of them, at the mean size of those
            # sized so far, would fill at most half the cache: a loader's admission, decided
            # over their sizes once all are known, then keeps every one of them too (the
            # keeper's own admission is decided over these few alone).
            fits = count > 0 and 2 * total * len(images) <= limit * count
            # An image whose header these bytes do not give is read further (its
            # failure, if any, is named when the header pass reads it again).
            found, _ = await read_headers(
                store,
                there,
                counters,
                reading.cached,
                stays=stays if fits else None,
                upright=reading.upright,
                held=held,
            )
            sizes.update(((there[j].key, there[j].etag), hw) for j, hw in found.items())
            out.update((o.key, o) for o, _ in got)
        await keep_sizes(store.url, folder, sizes, upright=reading.upright)
        return [out[n] for n in names]

    return ask
