"""What a cache folder keeps beside the cached objects about a URL: its object list, saved
so that a million objects are not listed again on every start, and the node-wide turn to
list it (:class:`ListingTurn`), so that the processes of a node list it once.

Files go in ``DIR/listings/``, named by a digest of the URL: ``.npz`` (the list), ``.lock``
(the turn), ``.budget`` (the node's shared in-flight budget,
:mod:`asyncloader._base._budget`) and ``.meta`` (a copy of a metadata file with
its ETag, one per file, so that captions and columns come from the node's disk like the listing).
Everything here takes the folder's path.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._base._folders import make_folder
from .._base._types import ObjectInfo
from ._objects import ObjectList

try:
    import fcntl
except ImportError:  # pragma: no cover (not POSIX)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ListingTurn",
    "budget_path",
    "listing_path",
    "load_listing",
    "load_listing_made",
    "load_metadata_copy",
    "metadata_path",
    "make_listings_folder",
    "save_listing",
    "save_metadata_copy",
]


def make_listings_folder(path: Path) -> None:
    """Make the folder of ``path`` (``DIR/listings``), and ``DIR`` its owner's only if it is
    missing too (see :func:`asyncloader._base._folders.make_folder`)."""
    make_folder(path.parent.parent)
    path.parent.mkdir(exist_ok=True)


def listing_path(directory: str | os.PathLike[str], url: str) -> Path:
    """Where the object list of ``url`` is kept in the cache folder ``directory``."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:32]
    return Path(directory) / "listings" / f"{digest}.npz"


def budget_path(directory: str | os.PathLike[str], url: str) -> Path:
    """The file through which the loaders of a node reading ``url`` into the cache folder
    ``directory`` share one in-flight budget (:class:`asyncloader._base._node_share.NodeShare`);
    its folder is made."""
    path = listing_path(directory, url).with_suffix(".budget")
    make_listings_folder(path)
    return path


def save_listing(
    path: Path, url: str, objects: Sequence[ObjectInfo], made: float | None = None
) -> None:
    """Keep the object list of ``url`` at ``path`` (written atomically): its arrays (see
    :class:`ObjectList`), read back in milliseconds for a million keys.  ``made``: when it
    was listed (default: now), for a listing saved again with more of its sizes known."""
    make_listings_folder(path)
    doc: dict[str, Any] = {
        "url": np.frombuffer(url.encode(), np.uint8),
        "time": np.array(time.time() if made is None else made),
        **ObjectList.of(objects).arrays(),
    }
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **doc)
    os.replace(tmp, path)


def load_listing(path: Path, url: str, max_age: float) -> ObjectList | None:
    """The object list of ``url`` saved at ``path`` if younger than ``max_age`` [seconds],
    else None (also when the file is damaged: the prefix is listed again)."""
    found = load_listing_made(path, url)
    if found is None or time.time() - found[1] > max_age:
        return None
    return found[0]


def load_listing_made(path: Path, url: str) -> tuple[ObjectList, float] | None:
    """The object list of ``url`` saved at ``path`` and when it was listed, whatever its
    age; None where there is none (or a damaged one)."""
    try:
        with np.load(path, allow_pickle=False) as doc:
            if doc["url"].tobytes() != url.encode():
                return None
            return ObjectList.from_arrays(doc), float(doc["time"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


_META_MAGIC = b"asyncloader metadata copy 1\n"


def metadata_path(directory: str | os.PathLike[str], url: str, name: str) -> Path:
    """Where the copy of ``url``'s metadata file ``name`` is kept in the cache folder
    ``directory``."""
    digest = hashlib.sha256(f"{url}\0{name}".encode()).hexdigest()[:32]
    return Path(directory) / "listings" / f"{digest}.meta"


def save_metadata_copy(path: Path, etag: str, data: bytes | bytearray | memoryview) -> None:
    """Keep ``data``, the metadata file whose ETag is ``etag``, at ``path`` (atomically)."""
    make_listings_folder(path)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(_META_MAGIC + etag.encode() + b"\n")
        f.write(data)
    os.replace(tmp, path)


def load_metadata_copy(path: Path, etag: str) -> bytes | None:
    """The copy kept at ``path`` if it is of the object whose ETag is ``etag`` (a copy of
    another version, a damaged one or none: None)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data.startswith(_META_MAGIC):
        return None
    kept, sep, body = data[len(_META_MAGIC) :].partition(b"\n")
    if not sep or kept.decode(errors="replace") != etag:
        return None
    return body


class ListingTurn:
    """An exclusive lock on listing one URL into a cache folder, so that the processes of a
    node that start together (ranks, DataLoader workers) list it once: the first lists and
    saves, the others wait their turn and read what it saved.

    An advisory ``flock`` on a file beside the saved listing: the kernel drops it when its
    holder exits, however it exits.  Waiting polls (every 20 ms), so a waiting loader can
    still be closed.  Without ``fcntl`` (not POSIX) everyone lists, as before.
    """

    _POLL = 0.02

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    async def acquire(self) -> None:
        if fcntl is None:
            return
        make_listings_folder(self._path)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(self._POLL)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Idempotent; closing the file drops the lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
