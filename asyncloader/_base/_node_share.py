"""What the loaders of one node reading one store share (:class:`NodeShare`): the node's
back-offs, and how many of them are active — a small file in the cache folder, mapped in
memory and changed under an advisory lock.  The in-flight budget (``_budget``) is its one
user: a back-off of any member is a back-off of all, and the growth and the floor are
divided among the active ones.

The standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import random
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["NodeShare"]

_MAGIC = b"ALNODE01"
_HEAD = struct.Struct("<8sqd")  # magic, back-offs so far, when the last one was
_SLOT = struct.Struct("<qd")  # a member's token (0: free), its last heartbeat
_SLOTS = 128
_SIZE = _HEAD.size + _SLOTS * _SLOT.size


class NodeShare:
    """What the loaders of one node reading one store share: the node's back-offs, and how
    many of them are active.  A small file (``path``, in the cache folder), mapped in
    memory and changed under an advisory lock; a member that has not been heard of for
    ``stale`` seconds (stopped, killed) no longer counts and its slot is taken again.

    Args:
        path: The file (made, with its folder, if missing).
        stale: Seconds without a heartbeat after which a member is gone.
        clock: Wall-clock seconds (shared by processes: not monotonic).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        stale: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self._stale = stale
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            with self._lock(fd):
                if os.fstat(fd).st_size < _SIZE:
                    # Written, not truncated to size: a sparse file's page would need its
                    # block when first written through the map, and on a full disk that
                    # is SIGBUS, not an error.
                    os.pwrite(fd, bytes(_SIZE), 0)
                self._map = mmap.mmap(fd, _SIZE)
                if self._map[: len(_MAGIC)] != _MAGIC:  # new (or another version's): reset
                    self._map[:] = bytes(_SIZE)
                    _HEAD.pack_into(self._map, 0, _MAGIC, 0, 0.0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._token = random.getrandbits(62) | 1
        self._slot = -1
        self.generation = 0  # the node's back-offs when this member last looked
        self.generation, _ = self.poll()  # joined: only later back-offs apply to it

    def __repr__(self) -> str:
        return f"NodeShare({str(self.path)!r})"

    @contextlib.contextmanager
    def _lock(self, fd: int | None = None) -> Iterator[None]:
        fd = self._fd if fd is None else fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _beat(self, now: float) -> None:
        """Refresh this member's heartbeat, taking a slot again if it lost its own (held
        a long time without a word, and given to another).  Under the lock."""
        m = self._map
        if self._slot >= 0 and _SLOT.unpack_from(m, _HEAD.size + self._slot * _SLOT.size)[0] == (
            self._token
        ):
            _SLOT.pack_into(m, _HEAD.size + self._slot * _SLOT.size, self._token, now)
            return
        self._slot = -1
        for i in range(_SLOTS):
            token, beat = _SLOT.unpack_from(m, _HEAD.size + i * _SLOT.size)
            if token == 0 or beat < now - self._stale:
                _SLOT.pack_into(m, _HEAD.size + i * _SLOT.size, self._token, now)
                self._slot = i
                return
        # Every slot taken: this member goes uncounted (the node is larger than the table).

    def poll(self) -> tuple[int, int]:
        """A heartbeat; the node's back-offs so far and its active members (this one
        included)."""
        now = self._clock()
        with self._lock():
            self._beat(now)
            _, generation, _ = _HEAD.unpack_from(self._map, 0)
            active = sum(
                1
                for i in range(_SLOTS)
                if (slot := _SLOT.unpack_from(self._map, _HEAD.size + i * _SLOT.size))[0]
                and slot[1] >= now - self._stale
            )
        return generation, max(1, active + (self._slot < 0))

    def back_off(self, gap: float) -> int:
        """A member was throttled: the node backs off, unless it did less than ``gap``
        seconds ago (one round of requests: the same congestion).  Returns the node's
        back-offs so far."""
        now = self._clock()
        with self._lock():
            magic, generation, last = _HEAD.unpack_from(self._map, 0)
            if now - last >= gap or now < last:
                generation += 1
                _HEAD.pack_into(self._map, 0, magic, generation, now)
        return int(generation)

    def close(self) -> None:
        """Leave the node (the slot is freed).  Idempotent."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError, ValueError):
            with self._lock():
                at = _HEAD.size + self._slot * _SLOT.size
                if self._slot >= 0 and _SLOT.unpack_from(self._map, at)[0] == self._token:
                    _SLOT.pack_into(self._map, at, 0, 0.0)
            self._map.close()
        os.close(self._fd)
        self._fd = -1
