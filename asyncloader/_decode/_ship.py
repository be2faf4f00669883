"""GPU decode with engine processes, the engine's half: a JPEG is shipped, not decoded.

With ``DecodeConfig(backend="cuda")`` and the engine in processes of its own (the default),
an engine does what is per sample — the fetch, the SSD cache, the JPEG's header, the crop's
plan — and leaves the decode to the training process, which owns the GPU: it copies the
JPEG's bytes into its ring slot's *arena* (shared memory, like the slot's pixels) and
writes the sample's :data:`~asyncloader._base._types.SHIP_RECORD`: where the bytes lie, the
image's size, the seed, the crop box and the flip.  The training process decodes the whole
batch in one call on its GPU (:mod:`._gpu_batch`).

A slot's arena (``DecodeConfig(ship_bytes=)`` per sample of its batch) is filled from its
start by each batch made in it (one bump allocator a slot, reset by the first sample of the
next batch made there: a slot is refilled only once its batch was given back).  What
nvJPEG is not given — not a baseline or progressive 8-bit JPEG in grey or YCbCr, or bytes
that no longer fit the arena — is decoded here by the CPU path into the sample's pixels, as
the thread backend would (record ``shipped`` 0).

Torch-free: engine processes never import it.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

import numpy as np
import numpy.typing as npt

from .._base._errors import DecodeError, shown_key
from .._base._orientation import jpeg_turned
from .._base._types import Blob, DecodeJob, DecodePath, Outcome
from ._image import DecodeSpec, U8Array, decode_into
from ._job import job_bytes, sample_view

__all__ = ["Shipper", "jpeg_header"]

# Start-of-frame markers nvJPEG decodes: baseline, extended and progressive Huffman.
_SOF_NVJPEG = (0xC0, 0xC1, 0xC2)
_SOF_OTHER = (0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)


def jpeg_header(data: Blob | memoryview) -> tuple[int, int, int] | None:
    """(width, height, components) of a complete JPEG nvJPEG decodes (Huffman-coded
    baseline, extended or progressive, 8-bit samples), from its markers alone; None for
    anything else: not a JPEG, lossless or arithmetic-coded, 12-bit, no end marker
    (truncated?), damaged markers.

    A few microseconds in Python where ``Image.open`` parses every marker in tens: the
    host threads share one GIL with the event loop.
    """
    view = memoryview(data)
    n = len(view)
    if n < 4 or view[0] != 0xFF or view[1] != 0xD8 or view[n - 2] != 0xFF or view[n - 1] != 0xD9:
        return None
    i = 2
    while i + 4 <= n:
        if view[i] != 0xFF:
            return None
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length
            i += 2
            continue
        length = (view[i + 2] << 8) | view[i + 3]
        if marker in _SOF_NVJPEG:
            if i + 10 > n or length < 8:
                return None
            if view[i + 4] != 8:  # 12-bit samples: the CPU path's
                return None
            height = (view[i + 5] << 8) | view[i + 6]
            width = (view[i + 7] << 8) | view[i + 8]
            return (width, height, view[i + 9]) if width and height else None
        if marker in _SOF_OTHER or marker in (0xDA, 0xD9) or length < 2:
            return None
        i += 2 + length
    return None


class Shipper:
    """Ships jobs into a shipped ring (see the module's docstring); thread-safe.

    Args:
        spec: What every decode needs (the transform plans the crop; the CPU path's).
        images: The ring's pixels (slots, batch, C, H, W): the CPU path's samples.
        records: The ring's records (slots, batch).
        arena: The ring's arenas (slots, bytes).
    """

    def __init__(
        self,
        spec: DecodeSpec,
        images: U8Array,
        records: npt.NDArray[np.void],
        arena: U8Array,
    ) -> None:
        if spec.transform is None or spec.decode_fn is not None:
            raise ValueError("shipping for GPU decode needs a transform and no decode= hook")
        # A scaled copy (for a DCT-scaled decode on the CPU) is no image for the GPU.
        self._spec = dataclasses.replace(spec, scaled_copies=False)
        self._images = images
        self._records = records
        self._arena = arena
        self._lock = threading.Lock()
        self._fill: dict[int, tuple[int, int]] = {}  # slot → (its batch's place, bytes used)

    def run(self, job: DecodeJob, batch: int) -> Outcome:
        """Ship ``job`` (of the stream's batch ``batch``), or decode it on the CPU where
        the GPU is not given it.

        Raises:
            DecodeError: an image over ``max_pixels``, or one the CPU path refuses.
        """
        t0 = time.perf_counter()
        data, events = job_bytes(job, self._spec)
        if data is None:
            return Outcome(time.perf_counter() - t0, events)
        record = self._records[job.slot, job.index : job.index + 1]  # a view
        record["seed"] = job.seed
        header = jpeg_header(data)
        if header is not None and self._spec.exif_orientation and jpeg_turned(data):
            header = None  # turned upright on the CPU
        if header is not None and header[2] in (1, 3):  # grey or YCbCr (not CMYK)
            width, height, _ = header
            if width * height > self._spec.max_pixels:
                raise DecodeError(
                    f"{shown_key(job.key)} is {width}x{height} pixels, over "
                    f"max_pixels={self._spec.max_pixels} (decompression bomb?)",
                    key=job.key,
                )
            key = job.key.encode()
            at = self._reserve(job.slot, batch, len(data) + len(key))
            if at is not None:
                self._ship(job, data, key, at, (width, height), record)
                return Outcome(time.perf_counter() - t0, events, DecodePath.SHIPPED)
        record["shipped"] = 0
        out = sample_view(self._images, job)
        decode_into(data, out, self._spec, job.seed, job.key, job.mark)
        return Outcome(time.perf_counter() - t0, events, DecodePath.GPU_TO_CPU)

    def _reserve(self, slot: int, batch: int, nbytes: int) -> int | None:
        """Where ``nbytes`` go in ``slot``'s arena for the stream's batch ``batch``; None
        when they no longer fit."""
        with self._lock:
            at_batch, used = self._fill.get(slot, (-1, 0))
            if at_batch != batch:  # the first sample of the slot's next batch
                used = 0
            if used + nbytes > self._arena.shape[1]:
                self._fill[slot] = (batch, used)
                return None
            self._fill[slot] = (batch, used + nbytes)
            return used

    def _ship(
        self,
        job: DecodeJob,
        data: Blob | memoryview,
        key: bytes,
        at: int,
        size: tuple[int, int],
        record: npt.NDArray[np.void],
    ) -> None:
        """The bytes (the key's after them, for messages) into the arena; the record."""
        n = len(data)
        arena = self._arena[job.slot]
        arena[at : at + n] = np.frombuffer(data, np.uint8)
        arena[at + n : at + n + len(key)] = np.frombuffer(key, np.uint8)
        assert self._spec.transform is not None
        plan = self._spec.transform.plan(size[0], size[1], random.Random(job.seed))
        record["offset"], record["length"], record["key_length"] = at, n, len(key)
        record["width"], record["height"] = size
        record["flip"] = int(plan.flip)
        record["box"] = plan.box
        record["shipped"] = 1  # last: the record is whole
