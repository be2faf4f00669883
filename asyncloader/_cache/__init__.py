"""The local SSD cache of object bytes, on diskcache.

* Keys are ``store URL + key + ETag``: a replaced object is a different entry, never a stale hit.
* Values of at least ``min_file_size`` (JPEGs always are) are appended to *pack files*, one
  per writing thread, and indexed in diskcache's SQLite table (a row per entry: the pack, the
  offset, the length).  A file per object cost 0.4–1.2 ms of CPU here, most of it the file
  system allocating an inode; an append costs the copy.  The bytes are written before the
  index rows commit, so a process killed mid-write leaves no visible entry (at worst unused
  bytes at a pack's end).  Smaller values live inside SQLite, as diskcache keeps them.
* Every value carries its CRC-32 (zlib's, computed by the ``_crc`` extension where it is
  built) as the entry's tag; every read checks length and CRC, and a damaged entry is
  deleted and reported as a miss, so it is fetched again, never decoded.
* Eviction keeps the directory under ``size_limit``, least-recently-*stored* first (with
  least-recently-used every hit would be a SQLite write): the oldest whole pack goes, with
  its entries, so nothing is ever rewritten.  A pack holds ``size_limit / 16`` at most.
* Several processes (loaders, DDP ranks, ``asyncloader warm``) share one directory safely.
* Layout: ``DIR/objects/`` (diskcache's own folder: the index, and the value files of
  entries written before packs), ``DIR/packs/``; beside them ``DIR/listings/`` (saved
  listings and the node's shared budget files: :mod:`asyncloader._dataset._saved`).

:class:`ObjectCache` is a small picklable handle: each process (and thread) opens its own
connection lazily, so it travels to decode worker processes as a few strings and numbers.

Its modules: diskcache's table as the cache uses it (``_schema``), what a folder holds
(``_stats``), the pack files (``_pack``), the index queries' thread (``_index_thread``), the
writer thread (``_writer``) and the subset a too-small cache keeps (``_admission``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .._base._config import CACHE_SIZE, CacheConfig
from .._base._folders import make_folder
from .._base._types import CachedAt
from ._index_thread import IndexThread
from ._pack import MAX_PACK, Pack, PackGone
from ._schema import PACK_SCHEMA, PACKED, check_layout, forget_pack
from ._schema import where as row_place
from ._stats import CacheStats, parse_size

try:  # zlib's CRC-32 by carry-less multiplication: 8 µs per 110 KB here, zlib's 26-39
    from . import _crc  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler
    _crc = None
_crc32: Callable[..., int] = _crc.crc32 if _crc is not None and _crc.FAST else zlib.crc32

__all__ = [
    "CacheStats",
    "IndexThread",
    "ObjectCache",
    "parse_size",
]


class ObjectCache:
    """Object bytes on local disk, shared by every process on the node.

    Args:
        directory: The cache folder.  Made on first use if missing, readable by its owner
            only (``drwx------``): on a shared node the cached objects of a private bucket
            are no one else's to read.  A folder that exists keeps its permissions.
        size_limit: Most bytes kept (``"500GB"``, ``"64GiB"`` or an int).
        min_file_size: Values of at least this many bytes are stored as files, smaller ones
            inside SQLite [bytes].
        group_shared: Make a missing folder for the owner's group too (``drwxrws---``:
            the group's users share one cache; run them with ``umask 002`` so that each
            can write what the others made).

    Raises:
        CacheFormatError: (on first use) the folder's index is not laid out as this
            version of asyncloader and diskcache expect.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        size_limit: int | str = CACHE_SIZE,
        min_file_size: int = 32 * 1024,
        group_shared: bool = False,
    ) -> None:
        self.directory = str(Path(directory).expanduser().resolve())
        self.size_limit = parse_size(size_limit)
        self.min_file_size = min_file_size
        self.group_shared = group_shared
        self._local = threading.local()

    @classmethod
    def opened(
        cls, directory: str | os.PathLike[str] | None, config: CacheConfig, *, make: bool = True
    ) -> ObjectCache | None:
        """The cache of ``directory`` kept as ``config`` says (None without a directory),
        its folder made before anything is written there (``make=False``: by the caller,
        later): how a loader, ``warm``, ``ls`` and ``bench`` open the folder they are
        given."""
        if not directory:
            return None
        cache = cls(directory, size_limit=config.size, group_shared=config.group_shared)
        if make:
            cache.make_folder()
        return cache

    def make_folder(self) -> None:
        """Make the cache folder if it is missing: its owner's only, or with
        ``group_shared`` its group's too (see :func:`asyncloader._base._folders.make_folder`)."""
        make_folder(self.directory, group_shared=self.group_shared)

    @property
    def _packs(self) -> str:
        return os.path.join(self.directory, "packs")

    @property
    def pack_size(self) -> int:
        """The most bytes a pack file grows to before the next one is started: a 16th of
        ``size_limit`` (eviction drops a pack at a time), 256 MiB at most."""
        return max(min(self.size_limit // 16, MAX_PACK), 1)

    def __repr__(self) -> str:
        return f"ObjectCache({self.directory!r}, size_limit={self.size_limit})"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "size_limit": self.size_limit,
            "min_file_size": self.min_file_size,
            "group_shared": self.group_shared,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory = state["directory"]
        self.size_limit = state["size_limit"]
        self.min_file_size = state["min_file_size"]
        self.group_shared = state["group_shared"]
        self._local = threading.local()

    def _db(self) -> Any:
        # One connection per thread and process: SQLite handles must not cross either.
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            import diskcache

            self.make_folder()
            db = diskcache.Cache(
                os.path.join(self.directory, "objects"),
                size_limit=self.size_limit,
                eviction_policy="least-recently-stored",
                disk_min_file_size=self.min_file_size,
                statistics=False,
                timeout=60,
            )
            check_layout(db, self.directory)
            for statement in PACK_SCHEMA:
                db._sql(statement)
            self._local.db = db
            self._local.pack = None
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
        row = db._sql(
            "SELECT filename, tag, mode, value FROM Cache WHERE key = ? AND raw = 1", (key,)
        ).fetchone()
        if row is None:
            return None
        where = row_place(*row)
        if where is not None and where.offset >= 0:
            return self.read(key, size, where)
        found = db.get(key, default=None, tag=True, retry=True)
        value, tag = found if found is not None else (None, None)
        if value is None:
            return None
        if (size >= 0 and len(value) != size) or _crc32(value) != tag:
            self._damaged(key)
            return None
        data: bytes = value
        return data

    def _damaged(self, key: str) -> None:
        # Readers that found the entry damaged together all miss; the one that drops it
        # counts it, so the count is of damaged entries, not of readers.
        if self._db().delete(key, retry=True):
            self._local.damaged = getattr(self._local, "damaged", 0) + 1

    def read(self, key: str, size: int, where: CachedAt) -> bytes | None:
        """The verified bytes of an entry :meth:`locate` found, read straight from its file
        (no index query); None if it was evicted since, or is damaged (then dropped)."""
        try:
            if where.offset >= 0:
                value = self._pread(where, where.length)
            else:
                with open(os.path.join(self.directory, "objects", where.filename), "rb") as f:
                    value = f.read()
        except FileNotFoundError:
            return None  # evicted (or replaced) since the batch's index query
        if (size >= 0 and len(value) != size) or _crc32(value) != where.crc:
            self._damaged(key)
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
            # Entries in packs have mode PACKED and "pack:offset:length" as their value.
            rows = db._sql(
                "SELECT key, filename, tag, mode, value FROM Cache"
                f" WHERE raw = 1 AND key IN ({marks})",
                chunk,
            ).fetchall()
            for key, *rest in rows:
                found[key] = row_place(*rest)
        return found

    def heads(self, keys: Sequence[str], n: int) -> dict[str, bytes]:
        """The first ``n`` bytes of each of ``keys`` the cache holds (an image's header):
        a value of at most ``n`` bytes whole and verified, as :meth:`read` gives it; of a
        longer one its first ``n`` bytes as its file holds them, unverified (its CRC is of
        the whole value: checked when the value is read whole, to decode it).  Keys not
        held, evicted since, damaged (dropped) or cut short are left out."""
        out: dict[str, bytes] = {}
        for key, where in self.locate(keys).items():
            if where is None:  # kept inside the index: small
                value = self.get(key, -1)
            elif where.offset < 0 or where.length <= n:
                value = self.read(key, -1, where)
            else:
                try:
                    value = self._pread(where, n)
                except FileNotFoundError:
                    value = None  # evicted since the index query
                value = value if value is not None and len(value) == n else None  # cut short
            if value is not None:
                out[key] = value[:n]
        return out

    def _pread(self, where: CachedAt, n: int) -> bytes:
        """The first ``n`` bytes of a packed entry, as its pack holds them.

        Raises:
            FileNotFoundError: its pack is gone (evicted).
        """
        fd = os.open(os.path.join(self._packs, where.filename), os.O_RDONLY)
        try:
            return os.pread(fd, n, where.offset)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` under ``key`` (atomically visible once complete)."""
        self.put_many([(key, data)])

    def put_many(self, items: Sequence[tuple[str, bytes | bytearray | memoryview]]) -> None:
        """Store several entries in one index transaction (cheaper per entry than ``put``).

        Their bytes are in the pack before the transaction commits, so a crash leaves either
        the whole batch or none of it visible.
        """
        items = list(dict(items).items())  # a key twice (fetched twice): the last one
        small = [(k, bytes(d)) for k, d in items if len(d) < self.min_file_size]
        if small:
            db = self._db()
            with db.transact(retry=True):
                for key, blob in small:
                    db.set(key, blob, tag=_crc32(blob), retry=True)
        large = [(k, memoryview(d).cast("B")) for k, d in items if len(d) >= self.min_file_size]
        if large:
            try:
                self._put_packed(large)
            except PackGone:  # evicted meanwhile: once more, into a new pack
                self._put_packed(large)

    def _put_packed(self, items: list[tuple[str, memoryview]]) -> None:
        db = self._db()
        # An entry is immutable (its key names the object's version): one stored meanwhile
        # (fetched twice, by a batch that looked before the first copy was written) stays.
        present = self.locate([key for key, _ in items])
        items = [(key, view) for key, view in items if key not in present]
        if not items:
            return
        pack: Pack | None = self._local.pack
        if pack is None or pack.pid != os.getpid():
            pack = self._local.pack = Pack.create(self._packs)
        try:
            crcs = [_crc32(view) for _, view in items]
            offsets = pack.append([view for _, view in items])
        except OSError:
            self._drop_pack()  # a full disk: the next batch starts a new pack
            raise
        now = time.time()
        gone: list[str] = []
        old_files: list[str] = []
        try:
            with db.transact(retry=True):
                sql = db._sql
                if pack.registered:
                    cur = sql(
                        "UPDATE AsyncloaderPack SET size = ? WHERE name = ?", (pack.end, pack.name)
                    )
                    if cur.rowcount == 0:
                        raise PackGone(pack.name)
                else:
                    sql(
                        "INSERT INTO AsyncloaderPack (name, size, created) VALUES (?, ?, ?)",
                        (pack.name, pack.end, time.time_ns()),
                    )
                keys = [key for key, _ in items]
                marks = ",".join("?" * len(keys))
                for rowid, filename in sql(
                    f"SELECT rowid, filename FROM Cache WHERE raw = 1 AND key IN ({marks})", keys
                ).fetchall():  # replaced entries (a file of the older layout goes too)
                    sql("DELETE FROM Cache WHERE rowid = ?", (rowid,))
                    if filename:
                        old_files.append(filename)
                # diskcache's row for a raw text key; size 0: the pack's row counts the bytes.
                db._con.executemany(
                    "INSERT INTO Cache (key, raw, store_time, expire_time, access_time,"
                    " access_count, tag, size, mode, filename, value)"
                    f" VALUES (?, 1, ?, NULL, ?, 0, ?, 0, {PACKED}, NULL, ?)",
                    [
                        (key, now, now, crc, f"{pack.name}:{offset}:{len(view)}")
                        for (key, view), crc, offset in zip(items, crcs, offsets, strict=True)
                    ],
                )
                gone = self._evict(db, keep=pack.name)
        except PackGone:
            self._drop_pack()
            raise
        pack.registered = True
        for filename in old_files:
            _remove(os.path.join(self.directory, "objects", filename))
        for name in gone:
            _remove(os.path.join(self._packs, name))
        if pack.end >= self.pack_size:
            self._drop_pack()  # full: the next batch starts a new one

    def _drop_pack(self) -> None:
        pack: Pack | None = getattr(self._local, "pack", None)
        if pack is not None:
            pack.close()
        self._local.pack = None

    def _evict(self, db: Any, keep: str) -> list[str]:
        """Inside a write transaction: drop the oldest packs (but ``keep``) and their
        entries until the cache fits ``size_limit``; the packs to remove once committed."""
        sql = db._sql
        ((packed,),) = sql("SELECT COALESCE(SUM(size), 0) FROM AsyncloaderPack").fetchall()
        excess = packed + db.volume() - self.size_limit
        gone: list[str] = []
        if excess <= 0:
            return gone
        for name, size in sql(
            "SELECT name, size FROM AsyncloaderPack WHERE name != ? ORDER BY created, name",
            (keep,),
        ).fetchall():
            forget_pack(sql, name)
            gone.append(name)
            excess -= size
            if excess <= 0:
                break
        return gone

    def contains(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` are present (a quick index check, no read)."""
        return set(self.locate(list(keys)))

    def take_damaged(self) -> int:
        """Damaged entries dropped by this thread since the last call."""
        n = getattr(self._local, "damaged", 0)
        self._local.damaged = 0
        return int(n)

    @staticmethod
    def is_cache(directory: str | os.PathLike[str]) -> bool:
        """``directory`` holds a cache: its index (``objects/cache.db``) is there."""
        return os.path.isfile(os.path.join(directory, "objects", "cache.db"))

    def stats(self) -> CacheStats:
        """Objects and bytes held (as diskcache counts its volume: the index's pages and
        the values, with the pack files' bytes), read without writing anything: no folder
        or index is made where there is none (then it holds nothing)."""
        index = Path(self.directory, "objects", "cache.db")
        if not index.is_file():
            return CacheStats(self.directory, 0, 0, self.size_limit)
        # `mode=rw`: an existing index only, opened with plain SELECTs (not diskcache,
        # which creates its tables and settings); SQLite's WAL files go with the connection.
        con = sqlite3.connect(f"{index.as_uri()}?mode=rw", uri=True, timeout=60)
        try:
            settings = dict(
                con.execute("SELECT key, value FROM Settings WHERE key IN ('count', 'size')")
            )
            ((pages,),) = con.execute("PRAGMA page_count").fetchall()
            ((page_size,),) = con.execute("PRAGMA page_size").fetchall()
            packed = 0
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'AsyncloaderPack'").fetchone():
                ((packed,),) = con.execute("SELECT COALESCE(SUM(size), 0) FROM AsyncloaderPack")
        finally:
            con.close()
        volume = pages * page_size + int(settings.get("size", 0)) + int(packed)
        return CacheStats(self.directory, int(settings.get("count", 0)), volume, self.size_limit)

    def verify(self) -> tuple[int, int]:
        """Read every entry, drop the damaged ones, entries whose pack is gone, and files
        no entry refers to; (checked, dropped)."""
        db = self._db()
        checked = dropped = 0
        with db.transact(retry=True):  # packs without a row or rows without a pack
            names = {n for (n,) in db._sql("SELECT name FROM AsyncloaderPack").fetchall()}
            for name in names:
                if not os.path.exists(os.path.join(self._packs, name)):
                    forget_pack(db._sql, name)
        cutoff = time.time() - 60  # a writer's new pack has its row within milliseconds
        for path in Path(self._packs).glob("*.pack") if os.path.isdir(self._packs) else ():
            if path.name not in names and path.stat().st_mtime < cutoff:
                _remove(str(path))
        self.take_damaged()
        for key in list(self.entry_keys()):
            checked += 1
            self.get(key, -1)  # drops a damaged entry
        dropped = self.take_damaged()
        db.check(fix=True, retry=True)  # orphan files from killed writers, index consistency
        return checked, dropped

    def entry_keys(self) -> Iterator[str]:
        """Every entry key (``store URL, key, ETag`` joined by NUL; what is kept beside an
        entry adds a NUL and its name: :func:`~asyncloader._base._types.derived_key`)."""
        yield from self._db().iterkeys()

    def clear(self) -> int:
        """Remove every entry; returns how many."""
        db = self._db()
        self._drop_pack()
        count = int(db.clear(retry=True))
        with db.transact(retry=True):
            db._sql("DELETE FROM AsyncloaderPack")
        if os.path.isdir(self._packs):
            for path in Path(self._packs).glob("*.pack"):
                _remove(str(path))
        return count

    def close(self) -> None:
        """Close this thread's handles: its index connection and its open pack file.  A
        SQLite connection belongs to the thread that opened it, so each thread that used
        the cache closes its own (the loader's threads do); the thread that drops the
        last reference to the cache, or leaves a ``with`` block, closes its own here."""
        self._drop_pack()
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def __enter__(self) -> ObjectCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # `ObjectCache(d).stats()`: the connection it opened goes with it, not to the
        # garbage collector (which Python 3.13 warns of).
        with contextlib.suppress(Exception):
            if getattr(self._local, "pid", None) == os.getpid():
                self.close()


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
