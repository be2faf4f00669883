"""The one rule that picks the decode backend for ``decode_backend="auto"``: the loader
applies it, and ``asyncloader bench`` recommends what it gives.

Measured on 2 cores: from the network, threads decode faster (fetched bytes need not
travel to a process); from the SSD cache, processes did with Pillow's decode and resize
(Python parts that hold the GIL), and threads do as well or better with the region decoder
and the resize extension, which hold it for almost nothing (README, ``bench_cache.py``).
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Literal

from ._image import FAST_RESIZE, ROI_DECODE

__all__ = ["Backend", "choose_backend"]

Backend = Literal["thread", "process"]


def choose_backend(*, cache: bool, decode_hook: bool, in_worker: bool | None = None) -> Backend:
    """``"process"`` where decode reads the SSD cache and would hold the GIL (the
    ``_jpegroi``/``_resize`` extensions not built, or a ``decode=`` hook), on POSIX (decode
    processes get their socket by inheritance), outside a DataLoader worker (the
    parallelism is there already, and DataLoader terminates its workers without giving a
    loader time to close); ``"thread"`` otherwise.

    Args:
        cache: Decode reads an SSD cache (``cache_dir``).
        decode_hook: A ``decode=`` hook replaces the built-in decode.
        in_worker: This process is a DataLoader worker (None: a daemonic process is one).
    """
    if in_worker is None:
        in_worker = multiprocessing.current_process().daemon
    holds_gil = not (ROI_DECODE and FAST_RESIZE) or decode_hook
    process = cache and os.name == "posix" and not in_worker and holds_gil
    return "process" if process else "thread"
