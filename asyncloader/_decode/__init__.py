"""Decode: bytes in, pixels written straight into a batch slot of the ring.

Two pools with one async interface (:class:`DecodePool`: ``await pool.decode(job)`` →
:class:`~asyncloader._base._types.Outcome`):

* :class:`ThreadDecodePool` (``_threads``) — threads of the training process;
* :class:`ProcessDecodePool` (``_processes``, child side ``_worker``) — fresh interpreters
  attached to the ring's shared memory;
* :class:`GpuDecodePool` (``_gpu``) — JPEGs decoded by nvJPEG on the GPU, a batch at a
  time, into a ring on the device (the one module here that imports torch).

``_image`` turns bytes into pixels (JPEGs by region through the ``_jpegroi`` C extension
where it is built: ``ROI_DECODE``; the resize straight into the slot through ``_resize``:
``FAST_RESIZE``) and makes the :func:`scaled_copies` of large JPEGs for the SSD cache;
``_job`` runs one job as a worker does (a cache read if need be, then pixels).  The names
below are imported on first use, so that a worker process imports its side only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._backend import choose_backend as choose_backend
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
    from ._processes import ProcessDecodePool as ProcessDecodePool
    from ._threads import ThreadDecodePool as ThreadDecodePool

_WHERE = {
    "choose_backend": "._backend",
    "FAST_RESIZE": "._image",
    "ROI_DECODE": "._image",
    "SCALED_COPY_MIN": "._image",
    "DecodeSpec": "._image",
    "decode_into": "._image",
    "scaled_copies": "._image",
    "scaled_footprint": "._image",
    "scaled_name": "._image",
    "GpuDecodePool": "._gpu",
    "DecodePool": "._job",
    "run_job": "._job",
    "ProcessDecodePool": "._processes",
    "ThreadDecodePool": "._threads",
}

__all__ = [
    "FAST_RESIZE",
    "ROI_DECODE",
    "SCALED_COPY_MIN",
    "DecodePool",
    "DecodeSpec",
    "GpuDecodePool",
    "ProcessDecodePool",
    "ThreadDecodePool",
    "choose_backend",
    "decode_into",
    "run_job",
    "scaled_copies",
    "scaled_footprint",
    "scaled_name",
]


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
