"""The shape every piece of test equipment has: started and stopped, or used as a context
manager that stops it on exit; and the processes below one, to check that none is left."""

from __future__ import annotations

import contextlib
import os
from types import TracebackType
from typing import Self

__all__ = ["Equipment", "descendants"]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children first (Linux: read from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Equipment:
    """Subclasses implement :meth:`start` and :meth:`stop` (idempotent)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError
