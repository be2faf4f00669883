"""Views that give their memory back when the last reference to them is gone (a leaf).

A batch the consumer receives is a tensor over memory the loader reuses: a ring slot, or an
output buffer of the uploader.  That memory may be written again only once nothing can read
it any more — not when the next batch is requested, and not when an iterator is dropped, but
when the last tensor, view or array over it has been freed.

:func:`leased` makes a numpy view whose base is a small exporter object holding a
:class:`Lease`.  Everything built from the view keeps it alive: ``torch.from_numpy`` (the
tensor's storage holds the array), slices and views of that tensor, ``tensor.numpy()``.
CPython frees an object the moment its reference count drops to zero, so the lease's
``__del__`` runs exactly when the last of them goes, in whichever thread dropped it: the
release callback must be thread-safe, cheap, and must not raise.  Several views may share
one lease (a batch's images and labels): it ends when all of them are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Lease", "leased"]


class Lease:
    """Calls ``release()`` once, when the last view holding it is freed.

    It keeps the source arrays of its views (so the memory stays mapped) and drops them
    just before calling ``release``: the owner may then unmap the memory at once.
    """

    __slots__ = ("__weakref__", "_release", "_sources")

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._sources: list[npt.NDArray[Any]] = []

    def __del__(self) -> None:
        # Runs in any thread, possibly during interpreter shutdown: never raise from here.
        try:
            self._sources.clear()
            self._release()
        except Exception:  # pragma: no cover - shutdown races only
            pass


class _Exporter:
    """Exports a source array's memory to numpy (as the view's ``base``), holding the lease."""

    __slots__ = ("__array_interface__", "_lease")

    def __init__(self, source: npt.NDArray[Any], lease: Lease) -> None:
        self.__array_interface__ = source.__array_interface__
        self._lease = lease


def leased(source: npt.NDArray[Any], lease: Lease) -> npt.NDArray[Any]:
    """A view of ``source`` (same memory, shape and dtype) that holds ``lease`` for as long
    as it, or anything made from it, lives."""
    lease._sources.append(source)
    return np.asarray(_Exporter(source, lease))
