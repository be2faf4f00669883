"""Local (or NFS) folders as an object store; file I/O runs off the event loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from .._base._errors import IntegrityError, ObjectNotFound
from .._base._types import ObjectInfo

__all__ = ["LocalStore"]


def _etag(st: os.stat_result) -> str:
    # Size, mtime and inode identify a version of a local file well enough to key a cache:
    # a file replaced by rename (copy tools, rsync) gets a new inode even within one mtime
    # tick.  An in-place rewrite of the same size within one tick is not detectable.
    return f"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"


class LocalStore:
    """A folder as an :class:`~asyncloader.ObjectStore`; keys are POSIX paths below it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()

    def __repr__(self) -> str:
        return f"LocalStore({self.url!r})"

    @property
    def url(self) -> str:
        return self.root.as_uri() + "/"

    def _walk(self, prefix: str) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        # Walk only below the deepest folder the prefix names.
        start = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            for name in sorted(filenames):
                key = rel_dir + name
                if key.startswith(prefix):
                    st = os.stat(os.path.join(dirpath, name))
                    out.append(ObjectInfo(key, st.st_size, _etag(st)))
        return out

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        if not self.root.is_dir():
            raise ObjectNotFound(f"not a folder: {self.root}", key=prefix)
        for info in await asyncio.to_thread(self._walk, prefix):
            yield info

    def _stat(self, key: str) -> ObjectInfo:
        try:
            st = os.stat(self.root / key)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"not found: {self.root / key}", key=key) from exc
        return ObjectInfo(key, st.st_size, _etag(st))

    async def stat(self, key: str) -> ObjectInfo:
        return await asyncio.to_thread(self._stat, key)

    def _read(self, key: str, start: int, end: int | None, etag: str) -> bytes:
        path = self.root / key
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if etag and _etag(st) != etag:
                    raise IntegrityError(f"{path} changed since it was listed", key=key)
                if start:
                    f.seek(start)
                return f.read(-1 if end is None else end - start)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"not found: {path}", key=key) from exc

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> bytes:
        data = await asyncio.to_thread(self._read, key, start, end, etag)
        if end is not None and len(data) != end - start:
            raise IntegrityError(f"{self.root / key} is shorter than listed", key=key)
        return data

    def _write(self, key: str, data: bytes) -> ObjectInfo:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # whole or not at all: a reader never sees half of it
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return ObjectInfo(key, len(data), _etag(os.stat(path)))

    async def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the file ``key`` (folders made as needed), replacing any file
        there at once (written beside it, then renamed)."""
        return await asyncio.to_thread(self._write, key, data)

    async def close(self) -> None:
        pass
