"""The one engine assembly: a loader's :class:`~._control.EngineSpec` becomes its engine,
in engine processes (:mod:`._engines`, each building its parts from the spec with
:meth:`LocalEngine.setup <._inline.LocalEngine.setup>`) or on a thread of this process
(:mod:`._inline`, the same call).

Where it runs is :func:`engine_placement`'s answer; an option that cannot go to
another process (a lambda, a local function) brings the engine back here with one
``RuntimeWarning`` that says why.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._base._config import engine_processes
from .._base._env import in_dataloader_worker
from .._base._shm import USE_MEMFD
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore
from ._local import LocalEngine
from ._parent import EngineProcesses
from ._surface import Engine, EngineSpec
from ._wire import OrderNotPicklable

if TYPE_CHECKING:
    import torch

    from .._run._build import LoaderPlan

__all__ = ["engine_placement", "start_engine"]


def start_engine(
    spec: EngineSpec,
    store: ObjectStore,
    processes: int,
    why_inline: str | None,
    *,
    counters: Counters,
    adopt: Callable[[Engine], None],
    listed: Callable[[Sequence[ObjectInfo]], None] | None = None,
    device: torch.device | None = None,
) -> None:
    """Start the engine of ``spec`` and hand it to ``adopt`` (before it lists: a failure
    after that leaves it to its owner to close).

    Args:
        spec: What it reads and how.
        store: The store, for an engine in this process (engine processes open their own).
        processes: Engine processes (0: in this process).
        why_inline: Why the default (processes) could not be followed, for the warning.
        counters: The inline engine's counters (the consumer's too).
        adopt: Takes the engine as soon as it exists.
        listed: Told the object list once complete (inline; processes list before).
        device: The GPU of a GPU decode's ring.

    Raises:
        AsyncLoaderError, ValueError: the engine could not start (a listing that failed,
            no samples), as the engine raised it.
    """
    if processes:
        try:
            adopt(EngineProcesses(spec, processes))
            return
        except OrderNotPicklable as exc:
            why_inline = f"an option cannot be sent to an engine process ({exc})"
    if why_inline is not None:
        warnings.warn(
            f"asyncloader runs its engine in this process: {why_inline}. "
            "EngineConfig(mode='inline') says so without this warning",
            RuntimeWarning,
            stacklevel=3,
        )
    engine = LocalEngine(spec.plan, counters)
    adopt(engine)
    engine.setup(store, spec, listed=listed, device=device)


def engine_placement(p: LoaderPlan, *, store_given: bool) -> tuple[int, str | None]:
    """How many engine processes the loader of ``p`` runs (0: inline, in this process),
    and why not where the default could not be followed (for the one warning)."""
    if p.engine.mode == "inline" or store_given:
        return 0, None
    if in_dataloader_worker():
        return 0, None  # a DataLoader worker: a process of its own already
    if os.name != "posix" or (not USE_MEMFD and not _dev_shm_writable()):
        return 0, "engine processes need shared memory (a memfd, or /dev/shm), not here"
    return engine_processes(p.engine.processes, p.workers, holds_gil=p.holds_gil), None


def _dev_shm_writable() -> bool:
    return not sys.platform.startswith("linux") or (
        os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
    )
