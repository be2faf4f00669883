"""The shape every piece of test equipment has: started and stopped, or used as a context
manager that stops it on exit; and the processes below one, to check that none is left, and
the CPU they spent together."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from .._base._proctree import descendants, process_cpu_seconds, tree_cpu_seconds

__all__ = ["Equipment", "descendants", "process_cpu_seconds", "tree_cpu_seconds"]


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
