"""Whether decode holds the GIL: the one rule behind the loader's default number of engine
processes (and the engines ``asyncloader bench`` advises).

Decode runs on threads of an engine: the region decoder and the resize extension
(``_jpegroi``, ``_resize``) hold the GIL for almost nothing, so one engine feeds 4 decode
threads (``WORKERS_PER_ENGINE``).  Where decode would hold it (those extensions not built,
so Pillow decodes and resizes, or a ``decode=`` hook written in Python), the loader runs
one engine process per decode worker, each with one decode thread, instead of more threads
that would take turns: measured on 2 cores with a GIL-bound hook, 2 engines of one decode
thread made 1.10 × the images/s of one engine with 2 decode processes at 0.91 × its CPU
per image, and 1.50 × the images/s of one engine with 2 decode threads (``bench_scale.py``,
``benchmarks/results/two_levels.json``).
"""

from __future__ import annotations

from ._image import FAST_RESIZE, ROI_DECODE

__all__ = ["decode_holds_gil"]


def decode_holds_gil(*, decode_hook: bool) -> bool:
    """Decode holds the GIL most of its time: a ``decode=`` hook (Python), or JPEGs decoded
    and resized by Pillow because the ``_jpegroi``/``_resize`` extensions are not built."""
    return decode_hook or not (ROI_DECODE and FAST_RESIZE)
