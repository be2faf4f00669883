"""Small value types and the plug-point protocols shared by every layer."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ._errors import shown_key

__all__ = [
    "Blob",
    "BlobCache",
    "CacheEvent",
    "CachedAt",
    "DecodeFn",
    "DecodeJob",
    "DecodePath",
    "ObjectInfo",
    "ObjectStore",
    "Outcome",
    "SHIP_RECORD",
    "Sample",
    "Shipped",
    "UNSIZED",
    "WritableStore",
    "derived_key",
]

Blob = bytes | bytearray
"""Object contents as the stores return them (a bytearray avoids a copy on receive)."""


UNSIZED = -2
"""An :class:`ObjectInfo`'s size not asked yet: a web server's folder names its images in
a metadata file without their sizes, and only the images a run keeps are asked for them
(a HEAD each: :meth:`asyncloader._stores._web.HttpStore.list_unsized`)."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object as listed by a store.

    Attributes:
        key: Key relative to the bucket/container (no leading slash).
        size: Length [bytes]; -1: the store has no such object (a manifest named it),
            reported missing when read; :data:`UNSIZED`: not asked yet.
        etag: The store's entity tag, without quotes; ``""`` when the store has none.
    """

    key: str
    size: int
    etag: str = ""

    def __repr__(self) -> str:
        # A key that is a presigned URL is a credential: show it without its query.
        return f"ObjectInfo(key={shown_key(self.key)!r}, size={self.size}, etag={self.etag!r})"


@dataclass(frozen=True, slots=True)
class Sample:
    """One entry of a dataset: the object and its integer label (``-1`` for none)."""

    obj: ObjectInfo
    label: int


@runtime_checkable
class ObjectStore(Protocol):
    """The one small async protocol every backend implements.

    All methods are coroutines run on the loader's event loop.  Errors are mapped to the
    :mod:`asyncloader._base._errors` tree at the backend boundary.  Retries are *not* the store's
    job: the fetcher retries :class:`Throttled` and :class:`TransientStoreError`.
    """

    @property
    def url(self) -> str:
        """The store's root URL (``s3://bucket/prefix/``), without any secret."""
        ...

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Yield every object under ``prefix`` (relative to the store's root), any order.

        A store may also offer ``list_sorted(prefix)``: the same objects in sorted key
        order, as ``(objects, ahead)`` chunks while it lists (see ``_stores/_listing.py``);
        an unshuffled loader then starts before the listing ends.
        """
        ...

    async def stat(self, key: str) -> ObjectInfo:
        """Return the object's size and ETag.  Raises ObjectNotFound."""
        ...

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        """Return bytes ``[start, end)`` of the object (``end=None``: to its end).

        When ``etag`` is given the store must refuse (IntegrityError) an object whose ETag
        differs, so a replaced object is never mixed with the old one.  The backend checks
        that the body has the announced length (IntegrityError / TransientStoreError).
        """
        ...

    async def close(self) -> None:
        """Release connections.  Idempotent."""
        ...


@runtime_checkable
class WritableStore(ObjectStore, Protocol):
    """A store that can also write an object (S3, Azure, GCS, local folders; a plain web
    server cannot): how ``asyncloader ls --write-manifest URL`` publishes a manifest."""

    async def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the object ``key``, replacing any object there, whole or not
        at all; return its size and new ETag (``""`` when the store did not say).  Retried
        on throttling and transient failures by the store itself (a PUT is idempotent)."""
        ...


class CachedAt(NamedTuple):
    """Where a cache entry's bytes are, as one index query for a whole batch found them:
    the value file (relative to the cache's object folder) and its CRC32; for an entry in a
    pack file (``offset >= 0``), the pack's name and the entry's place in it."""

    filename: str
    crc: int
    offset: int = -1
    length: int = -1


class BlobCache(Protocol):
    """Where decode workers read object bytes (the SSD cache); picklable."""

    def get(self, key: str, size: int) -> bytes | None:
        """Verified bytes, or None on a miss or a damaged entry (which is dropped)."""
        ...

    def read(self, key: str, size: int, where: CachedAt) -> bytes | None:
        """Like :meth:`get`, from a location :meth:`ObjectCache.locate` found (no index
        query); None when the entry went (evicted) or is damaged (dropped)."""
        ...

    def take_damaged(self) -> int:
        """Damaged entries this thread dropped since the last call."""
        ...

    def close(self) -> None:
        """Close this thread's handles (its index connection, its open pack file): each
        thread that read calls it before it ends, as SQLite connections belong to their
        thread and none other can close them."""
        ...


def derived_key(entry_key: str, name: str) -> str:
    """The cache key of something kept beside the entry ``entry_key`` and made from its
    bytes (``name``: which, e.g. a scaled copy of a JPEG)."""
    return f"{entry_key}\x00{name}"


DecodeFn = Callable[[Blob], npt.NDArray[np.uint8]]
"""A ``decode=`` hook: object bytes → uint8 array of the loader's sample shape."""


# --- messages between stages --------------------------------------------------------------


class CacheEvent(enum.IntFlag):
    """What happened around the SSD cache while a decode job ran (counted in stats)."""

    NONE = 0
    HIT = 1  # the bytes came from the cache
    MISS = 2  # not in the cache (or damaged): nothing decoded, the loop must fetch
    DAMAGED = 4  # a damaged cache entry was found and dropped
    SCALED = 8  # decoded from a scaled copy of the object (a large JPEG), not the object


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """One sample for a decode worker: bytes (or where the cache has them) → a ring slot.

    Attributes:
        data: Fetched bytes; a :class:`CachedAt` (read the cache there); or None (look
            the key up in the cache).
        slot, index: Where in the ring the pixels go.
        seed: The sample's augmentation seed.
        key: The object's key (for messages).
        cache_key: The cache entry's key; ``""`` without a cache.
        size: The listed size [bytes] (-1: unknown).
        mark: A bucketed batch's sample: its bucket's height and width and the image's
            recorded height and width (the decode checks the image has them), else None.
    """

    data: Blob | CachedAt | None
    slot: int
    index: int
    seed: int
    key: str
    cache_key: str = ""
    size: int = -1
    mark: tuple[int, int, int, int] | None = None


class DecodePath(enum.IntEnum):
    """Where a sample was decoded (``stats()`` counts the GPU path's)."""

    CPU = 0  # the CPU path, as asked (DecodeConfig(backend="thread"))
    GPU = 1  # on the GPU (backend="cuda"), the decoded image checked
    GPU_TO_CPU = 2  # backend="cuda", on the CPU: not given to the GPU, or refused by it
    GPU_SUSPECT = 3  # backend="cuda": the GPU's image failed the check, decoded on the CPU
    SHIPPED = 4  # backend="cuda", engine processes: its bytes and plan shipped to the trainer
    GPU_HARDWARE = 5  # as GPU, by nvJPEG's hardware decoder (see _decode/_nvjpeg.py)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a decode job went: the worker's busy time [seconds], the cache events and
    where the image was decoded."""

    busy: float = 0.0
    events: CacheEvent = CacheEvent.NONE
    path: DecodePath = DecodePath.CPU


SHIP_RECORD = np.dtype(
    [
        ("shipped", np.int64),  # 1: bytes in the slot's arena; 0: pixels in the sample
        ("offset", np.int64),  # where in the slot's arena the bytes start [bytes]
        ("length", np.int64),  # [bytes]
        ("key_length", np.int64),  # the object's key follows the bytes, UTF-8 [bytes]
        ("width", np.int64),  # the image's, from its header [pixels]
        ("height", np.int64),
        ("seed", np.uint64),  # the sample's seed (the CPU path's plan, where it takes over)
        ("flip", np.int64),  # mirrored
        ("box", np.float64, (4,)),  # the crop in source pixels: left, top, right, bottom
    ]
)
"""One sample of a shipped batch (GPU decode in the training process, the engine in
processes): where its JPEG lies in its slot's arena and the crop its engine planned."""


@dataclass(frozen=True, slots=True)
class Shipped:
    """A batch its engine shipped for the training process to decode on its GPU: views
    of its ring slot that hold the slot while they live.

    Attributes:
        pixels: uint8 [n, C, H, W]: the samples decoded by the engine (record ``shipped``
            0: what the GPU is not given).
        records: :data:`SHIP_RECORD` [n], a sample each, in batch order.
        arena: The slot's arena: the shipped samples' JPEG bytes.
    """

    pixels: npt.NDArray[np.uint8]
    records: npt.NDArray[np.void]
    arena: npt.NDArray[np.uint8]

    @property
    def shape(self) -> tuple[int, ...]:
        """The batch's shape, as its pixels'."""
        return tuple(self.pixels.shape)
