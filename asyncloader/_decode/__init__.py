"""Decode: bytes in, pixels written straight into a batch slot of the ring.

Two pools with one async interface (:class:`DecodePool`: ``await pool.decode(job)`` →
:class:`~asyncloader._types.Outcome`):

* :class:`ThreadDecodePool` (``_threads``) — threads of the training process;
* :class:`ProcessDecodePool` (``_processes``, child side ``_worker``) — fresh interpreters
  attached to the ring's shared memory.

``_image`` turns bytes into pixels (JPEGs by region through the ``_jpegroi`` C extension
where it is built: ``ROI_DECODE``); ``_job`` runs one job as a worker does (cache read or
write-back, then pixels).
"""

from ._image import ROI_DECODE as ROI_DECODE
from ._image import DecodeSpec as DecodeSpec
from ._image import decode_into as decode_into
from ._job import DecodePool as DecodePool
from ._job import run_job as run_job
from ._processes import ProcessDecodePool as ProcessDecodePool
from ._threads import ThreadDecodePool as ThreadDecodePool

__all__ = [
    "ROI_DECODE",
    "DecodePool",
    "DecodeSpec",
    "ProcessDecodePool",
    "ThreadDecodePool",
    "decode_into",
    "run_job",
]
