"""The local SSD cache of object bytes, on diskcache.

* Keys are ``store URL + key + ETag``: a replaced object is a different entry, never a stale hit.
* Values are stored as files once they reach ``min_file_size`` (JPEGs always are), indexed in
  SQLite; diskcache writes the file completely before the index row commits, so a process
  killed mid-write leaves no visible entry (at worst an orphan file that ``verify`` removes).
* Every value carries its CRC-32 as the entry's tag; every read checks length and CRC, and a
  damaged entry is deleted and reported as a miss, so it is fetched again, never decoded.
* Eviction keeps the directory under ``size_limit`` with diskcache's least-recently-*stored*
  policy: with least-recently-used every hit would be a SQLite write.
* Several processes (loaders, DDP ranks, ``asyncloader warm``) share one directory safely.
* The object list of a prefix is kept beside it, so a million objects are not listed again on
  every start.  Layout: ``DIR/objects/`` (diskcache's own folder) and ``DIR/listings/``.

:class:`ObjectCache` is a small picklable handle: each process (and thread) opens its own
connection lazily, so it travels to decode worker processes as a few strings and numbers.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import re
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ._types import CachedAt, ObjectInfo

__all__ = ["CacheStats", "ObjectCache", "parse_size"]

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(size: int | str) -> int:
    """``"500GB"`` → 500·10⁹ bytes; ``"2GiB"`` → 2·2³⁰; an int is bytes already.

    Raises:
        ValueError: not a size.
    """
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", size)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {size!r} (examples: 500GB, 64GiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What is in a cache directory: entries, bytes [bytes] and the size limit [bytes]."""

    directory: str
    entries: int
    volume: int
    size_limit: int


@functools.cache
def _disk_class() -> type:
    """diskcache's ``Disk``, with value files written the cheap way.

    Measured on 110 KB values (the writer of ``warm`` spent ~1 ms of CPU per object):

    * ``Disk.store`` hands a value to ``_write`` as ``io.BytesIO``, and iterating a BytesIO
      yields *lines*: a JPEG has a newline byte every ~256 bytes, so a value took ~430 write
      calls.  Here a BytesIO is written in one call.
    * Value files went into two levels of random folders (65 536 of them), so nearly every
      new file needed a new folder (a ``mkdir`` of ~0.25–0.5 ms).  Here they go into one
      level of 256 folders, as git's objects do (3900 files each per million entries).
      Rows keep each file's relative name, so entries written with the old layout are still
      read and evicted.
    * ``_write`` tried to create the folder before every file; this one remembers the
      folders it made, and makes one again only when opening a file in it fails (another
      process may have removed it: ``cache clear``, eviction).
    """
    import diskcache

    class Disk(diskcache.Disk):  # type: ignore[misc]
        _made: ClassVar[set[str]] = set()

        def filename(self, key: Any = None, value: Any = None) -> tuple[str, str]:
            hex_name = os.urandom(16).hex()
            name = os.path.join(hex_name[:2], hex_name[2:] + ".val")
            return name, os.path.join(self._directory, name)

        def _write(self, full_path: str, iterator: Any, mode: str, encoding: Any = None) -> int:
            folder = os.path.dirname(full_path)
            if folder not in self._made:
                os.makedirs(folder, exist_ok=True)
                self._made.add(folder)
            try:
                writer = open(full_path, mode, encoding=encoding)  # noqa: SIM115
            except FileNotFoundError:
                self._made.discard(folder)
                return int(super()._write(full_path, iterator, mode, encoding))
            with writer:
                if isinstance(iterator, io.BytesIO):
                    with iterator.getbuffer() as view:
                        writer.write(view)
                        return len(view)
                size = 0
                for chunk in iterator:
                    size += len(chunk)
                    writer.write(chunk)
                return size

    return Disk


class ObjectCache:
    """Object bytes on local disk, shared by every process on the node.

    Args:
        directory: The cache folder (created if missing).
        size_limit: Most bytes kept (``"500GB"``, ``"64GiB"`` or an int).
        min_file_size: Values of at least this many bytes are stored as files, smaller ones
            inside SQLite [bytes].
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        size_limit: int | str = "100GB",
        min_file_size: int = 32 * 1024,
    ) -> None:
        self.directory = str(Path(directory).expanduser().resolve())
        self.size_limit = parse_size(size_limit)
        self.min_file_size = min_file_size
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"ObjectCache({self.directory!r}, size_limit={self.size_limit})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "size_limit": self.size_limit,
            "min_file_size": self.min_file_size,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory = state["directory"]
        self.size_limit = state["size_limit"]
        self.min_file_size = state["min_file_size"]
        self._local = threading.local()

    def _db(self) -> Any:
        # One connection per thread and process: SQLite handles must not cross either.
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            import diskcache

            db = diskcache.Cache(
                os.path.join(self.directory, "objects"),
                disk=_disk_class(),
                size_limit=self.size_limit,
                eviction_policy="least-recently-stored",
                disk_min_file_size=self.min_file_size,
                statistics=False,
                timeout=60,
            )
            self._local.db = db
            self._local.pid = os.getpid()
        return db

    @staticmethod
    def entry_key(store_url: str, key: str, etag: str) -> str:
        """The cache key of one object version."""
        return f"{store_url}\x00{key}\x00{etag}"

    def get(self, key: str, size: int) -> bytes | None:
        """The verified bytes of ``key``, or None on a miss or a damaged entry (dropped).

        ``size`` is the listed length (``-1``: unknown, only the CRC is checked).
        """
        db = self._db()
        found = db.get(key, default=None, tag=True, retry=True)
        value, tag = found if found is not None else (None, None)
        if value is None:
            return None
        if (size >= 0 and len(value) != size) or zlib.crc32(value) != tag:
            db.delete(key, retry=True)
            self._local.damaged = getattr(self._local, "damaged", 0) + 1
            return None
        data: bytes = value
        return data

    def read(self, key: str, size: int, where: CachedAt) -> bytes | None:
        """The verified bytes of an entry :meth:`locate` found, read straight from its file
        (no index query); None if it was evicted since, or is damaged (then dropped)."""
        path = os.path.join(self.directory, "objects", where.filename)
        try:
            with open(path, "rb") as f:
                value = f.read()
        except FileNotFoundError:
            return None  # evicted (or replaced) since the batch's index query
        if (size >= 0 and len(value) != size) or zlib.crc32(value) != where.crc:
            self._db().delete(key, retry=True)
            self._local.damaged = getattr(self._local, "damaged", 0) + 1
            return None
        return value

    def locate(self, keys: Sequence[str]) -> dict[str, CachedAt | None]:
        """Which of ``keys`` are present, and where: one index query per 500 keys (a batch),
        instead of one per key.  ``None`` for an entry kept inside the index (values below
        ``min_file_size``): read it with :meth:`get`."""
        db = self._db()
        found: dict[str, CachedAt | None] = {}
        for i in range(0, len(keys), 500):
            chunk = list(keys[i : i + 500])
            marks = ",".join("?" * len(chunk))
            # diskcache's own table: text keys are stored as they are (raw = 1); `tag` is
            # the CRC32 we set, `filename` the value file (NULL for values kept inline).
            rows = db._sql(
                f"SELECT key, filename, tag FROM Cache WHERE raw = 1 AND key IN ({marks})", chunk
            ).fetchall()
            for key, filename, tag in rows:
                if filename and isinstance(tag, int):
                    found[key] = CachedAt(filename, tag)
                else:
                    found[key] = None
        return found

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` (atomically visible once complete)."""
        blob = bytes(data)
        self._db().set(key, blob, tag=zlib.crc32(blob), retry=True)

    def put_many(self, items: Sequence[tuple[str, bytes | bytearray]]) -> None:
        """Store several entries in one index transaction (cheaper per entry than ``put``).

        Each value file is complete before the transaction commits, so a crash leaves either
        the whole batch or none of it visible (and at worst orphan files ``verify`` removes).
        """
        db = self._db()
        with db.transact(retry=True):
            for key, data in items:
                blob = bytes(data)
                db.set(key, blob, tag=zlib.crc32(blob), retry=True)

    def contains(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` are present (a quick index check, no read)."""
        return set(self.locate(list(keys)))

    def take_damaged(self) -> int:
        """Damaged entries dropped by this thread since the last call."""
        n = getattr(self._local, "damaged", 0)
        self._local.damaged = 0
        return int(n)

    def stats(self) -> CacheStats:
        db = self._db()
        return CacheStats(self.directory, len(db), int(db.volume()), self.size_limit)

    def verify(self) -> tuple[int, int]:
        """Read every entry, drop the damaged ones and orphan files; (checked, dropped)."""
        db = self._db()
        checked = dropped = 0
        for key in list(self.entry_keys()):
            checked += 1
            found = db.get(key, default=None, tag=True, retry=True)
            if found is None:
                continue
            value, tag = found
            if not isinstance(value, bytes) or zlib.crc32(value) != tag:
                db.delete(key, retry=True)
                dropped += 1
        db.check(fix=True, retry=True)  # orphan files from killed writers, index consistency
        return checked, dropped

    def entry_keys(self) -> Iterator[str]:
        """Every entry key (``store URL, key, ETag`` joined by NUL)."""
        yield from self._db().iterkeys()

    def clear(self) -> int:
        """Remove every entry; returns how many."""
        return int(self._db().clear(retry=True))

    # --- listings -----------------------------------------------------------------------

    def _listing_path(self, url: str) -> Path:
        digest = hashlib.sha256(url.encode()).hexdigest()[:32]
        return Path(self.directory) / "listings" / f"{digest}.json.gz"

    def save_listing(self, url: str, objects: Sequence[ObjectInfo]) -> None:
        """Keep the object list of ``url`` next to the cache (written atomically)."""
        path = self._listing_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "url": url,
            "time": time.time(),
            "objects": [[o.key, o.size, o.etag] for o in objects],
        }
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        with gzip.open(tmp, "wt", compresslevel=1) as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def load_listing(self, url: str, max_age: float) -> list[ObjectInfo] | None:
        """The saved object list of ``url`` if younger than ``max_age`` [seconds], else None."""
        path = self._listing_path(url)
        try:
            with gzip.open(path, "rt") as f:
                doc = json.load(f)
        except (OSError, ValueError, EOFError):
            return None
        if doc.get("url") != url or time.time() - float(doc.get("time", 0)) > max_age:
            return None
        return [ObjectInfo(k, int(n), e) for k, n, e in doc["objects"]]

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
