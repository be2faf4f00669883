"""diskcache's table as this cache uses it: the columns its rows are written into, the mode
of ours that marks an entry kept in a pack file, the pack table, the check that a folder's
index is laid out so, and where a row's bytes lie.  Only the cache wing knows these (its
``__init__`` writes and reads the rows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._base._errors import CacheFormatError
from .._base._types import CachedAt

__all__ = ["PACKED", "PACK_SCHEMA", "check_layout", "forget_pack", "where"]

PACKED = 5  # Cache.mode of an entry kept in a pack file (diskcache's own modes are 0-4)
PACK_SCHEMA = (
    # One row per pack file: its committed length and when it was made (eviction order).
    "CREATE TABLE IF NOT EXISTS AsyncloaderPack"
    " (name TEXT PRIMARY KEY, size INTEGER NOT NULL, created INTEGER NOT NULL)",
    # An entry's value is "pack:offset:length": a pack's entries are one range of values.
    f"CREATE INDEX IF NOT EXISTS AsyncloaderPackEntry ON Cache(value) WHERE mode = {PACKED}",
)
# The columns of diskcache's table that the pack entries are rows of (diskcache 5.x): the
# entries write and read them directly, so another layout must stop the cache, not be
# written into.
CACHE_COLUMNS = (
    "rowid",
    "key",
    "raw",
    "store_time",
    "expire_time",
    "access_time",
    "access_count",
    "tag",
    "size",
    "mode",
    "filename",
    "value",
)


def check_layout(db: Any, directory: str) -> None:
    """Raise :class:`CacheFormatError` unless diskcache's table has the columns the pack
    entries are written into, with the meaning this module gives them."""
    import diskcache

    columns = tuple(row[1] for row in db._sql("PRAGMA table_info(Cache)").fetchall())
    if columns != CACHE_COLUMNS:
        db.close()
        raise CacheFormatError(
            f"the cache index in {directory} has columns {columns}, not the {CACHE_COLUMNS} "
            f"this version of asyncloader writes (diskcache {diskcache.__version__}): "
            "install a diskcache of the 5.x series, or use another cache folder"
        )


def forget_pack(sql: Callable[..., Any], name: str) -> None:
    """Inside a write transaction: drop pack ``name``'s row and every entry in it (their
    values are ``name:offset:length``, one range of the partial index)."""
    sql(
        f"DELETE FROM Cache WHERE mode = {PACKED} AND value > ? AND value < ?",
        (f"{name}:", f"{name};"),  # ';' follows ':'
    )
    sql("DELETE FROM AsyncloaderPack WHERE name = ?", (name,))


def where(filename: str | None, tag: Any, mode: int, value: Any) -> CachedAt | None:
    """Where an index row's bytes are: a value file, a place in a pack, or None (inside
    the index: read it with ``get``)."""
    if not isinstance(tag, int):
        return None
    if mode == PACKED:
        name, offset, length = str(value).split(":")
        return CachedAt(name, tag, int(offset), int(length))
    return CachedAt(filename, tag) if filename else None
