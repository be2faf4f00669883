"""Pack files: the files a cache's values are appended to, one per writing thread (an
append costs the copy; a file per object cost 0.4–1.2 ms of CPU, most of it the file
system allocating an inode)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_PACK", "Pack", "PackGone"]

MAX_PACK = 256 * 2**20
_writev = getattr(os, "writev", None)
_IOV_MAX = 1024  # buffers one writev takes (Linux, macOS)


class PackGone(Exception):
    """The pack this thread appends to was evicted or cleared by another process."""


@dataclass(slots=True)
class Pack:
    """The pack file one thread appends to."""

    name: str
    fd: int
    pid: int
    end: int = 0  # bytes written
    registered: bool = False  # has a row in AsyncloaderPack

    @classmethod
    def create(cls, folder: str) -> Pack:
        # Names sort by creation time; pid and random bits make them unique across processes.
        name = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(4).hex()}.pack"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(os.path.join(folder, name), flags, 0o644)
        except FileNotFoundError:  # the folder was removed (``cache clear`` by hand)
            os.makedirs(folder, exist_ok=True)
            fd = os.open(os.path.join(folder, name), flags, 0o644)
        return cls(name, fd, os.getpid())

    def append(self, views: Sequence[memoryview]) -> list[int]:
        """Write ``views`` one after another at the end; their offsets.  One system call
        for them all where the OS gathers (``writev``): one release of the GIL per batch
        instead of one per object."""
        offsets = []
        at = self.end
        for view in views:
            offsets.append(at)
            at += len(view)
        pending = [v for v in views if len(v)]
        while pending:
            if _writev is not None:
                n = _writev(self.fd, pending[:_IOV_MAX])
            else:  # pragma: no cover (not POSIX)
                n = os.write(self.fd, pending[0])
            self.end += n
            while n:  # drop what was written, keep the rest of a view written in part
                if n >= len(pending[0]):
                    n -= len(pending.pop(0))
                else:
                    pending[0], n = pending[0][n:], 0
        return offsets

    def close(self) -> None:
        if self.pid == os.getpid():
            os.close(self.fd)
