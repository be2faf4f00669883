"""Decode: bytes in, pixels written straight into a batch slot of the ring.

Two pools with one async interface (:class:`DecodePool`: ``await pool.decode(job)`` →
:class:`~asyncloader._base._types.Outcome`):

* :class:`ThreadDecodePool` (``_threads``) — threads of the engine's process, writing into
  its ring (where decode holds the GIL, the loader runs more engines of one thread each:
  ``_backend``);
* :class:`GpuDecodePool` (``_gpu``) — JPEGs decoded by nvJPEG on the GPU, a batch at a
  time, into a ring on the device, where the engine runs in the training process.

With GPU decode and engine processes, the engine's threads ship each JPEG with its crop
plan into its ring slot instead of decoding it (``_ship``), and the training process decodes
each batch on its GPU (``_gpu_batch``: the batch's decode, check and resize, which the GPU
pool runs too; ``_nvjpeg`` asks nvJPEG which JPEGs its hardware decoder takes and how many
engines it has).  ``_gpu``, ``_gpu_batch``, ``_nvjpeg`` and ``_resample`` import torch;
nothing else here does.

``_image`` turns bytes into pixels (JPEGs by region through the ``_jpegroi`` C extension
where it is built: ``ROI_DECODE``; the resize straight into the slot through ``_resize``:
``FAST_RESIZE``) and makes the :func:`scaled_copies` of large JPEGs for the SSD cache;
``_job`` runs one job as a worker does (a cache read if need be, then pixels).  The names
below are imported on first use: the GPU pool's torch only where it runs.

Also here: crop plans (``_transforms``), results back to the loop (``_completions``) and
the GPU path's headers and resize law (``_resample``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._backend import decode_holds_gil as decode_holds_gil
    from ._gpu import GpuDecodePool as GpuDecodePool
    from ._image import FAST_RESIZE as FAST_RESIZE
    from ._image import ROI_DECODE as ROI_DECODE
    from ._image import SCALED_COPY_MIN as SCALED_COPY_MIN
    from ._image import DecodeSpec as DecodeSpec
    from ._image import decode_into as decode_into
    from ._image import scaled_copies as scaled_copies
    from ._image import scaled_footprint as scaled_footprint
    from ._image import scaled_name as scaled_name
    from ._job import DecodePool as DecodePool
    from ._job import run_job as run_job
    from ._threads import ThreadDecodePool as ThreadDecodePool

__all__, __getattr__, __dir__ = lazy_exports(__name__, globals())
