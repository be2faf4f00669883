"""nvJPEG's hardware JPEG decoder: whether the GPU has one, how many engines it reports,
and which JPEGs go to it.

torchvision's batched ``decode_jpeg(device="cuda")`` opens nvJPEG with its hardware
backend and sends each JPEG that ``nvjpegDecodeBatchedSupported`` accepts to the batched
hardware decode; the rest (progressive JPEGs, some subsamplings) it decodes with CUDA
kernels.  On a GPU without hardware JPEG engines (``nvjpegGetHardwareDecoderInfo``
reports none) every JPEG is decoded with CUDA kernels.  torchvision reports neither, so
:class:`NvjpegProbe` asks the same questions of the same library: the ``libnvjpeg`` that
torchvision's image extension loaded into this process (found in ``/proc/self/maps``),
through ``ctypes``, with a handle of its own.  Where that library, its symbols or a
handle cannot be had, the probe is None and the hardware's part is unknown (``stats()``
says so); nothing here changes what is decoded, or how.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Protocol

import torch

__all__ = ["HardwareProbe", "NvjpegProbe"]

log = logging.getLogger(__name__)

_BACKEND_HARDWARE = 3  # nvjpegBackend_t's NVJPEG_BACKEND_HARDWARE
_SUCCESS = 0  # nvjpegStatus_t's NVJPEG_STATUS_SUCCESS


def _loaded_nvjpeg() -> str | None:
    """The path of the libnvjpeg mapped into this process (torchvision's), if any."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        if len(fields) == 6 and "/libnvjpeg" in fields[5]:
            return fields[5].strip()
    return None


class HardwareProbe(Protocol):
    """What the GPU batch asks of a JPEG decoder's hardware (:class:`NvjpegProbe`)."""

    engines: int

    def takes(self, jpeg: torch.Tensor) -> bool:
        """Whether the hardware decoder decodes ``jpeg`` (uint8 bytes on the CPU)."""
        ...


class NvjpegProbe:
    """nvJPEG's hardware decoder on the current CUDA device, asked through ``lib``.

    Attributes:
        engines: The hardware JPEG engines nvJPEG reports (0: none, every JPEG is decoded
            with CUDA kernels).
        cores: The cores of each engine.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        c = ctypes
        handle, stream = c.c_void_p, c.c_void_p
        lib.nvjpegCreateEx.argtypes = [c.c_int, c.c_void_p, c.c_void_p, c.c_uint, c.POINTER(handle)]
        lib.nvjpegGetHardwareDecoderInfo.argtypes = [
            handle,
            c.POINTER(c.c_uint),
            c.POINTER(c.c_uint),
        ]
        lib.nvjpegJpegStreamCreate.argtypes = [handle, c.POINTER(stream)]
        lib.nvjpegJpegStreamParseHeader.argtypes = [handle, c.c_void_p, c.c_size_t, stream]
        lib.nvjpegDecodeBatchedSupported.argtypes = [handle, stream, c.POINTER(c.c_int)]
        self._lib = lib
        self._handle = ctypes.c_void_p()
        self._stream = ctypes.c_void_p()
        self.engines = 0
        self.cores = 0
        status = lib.nvjpegCreateEx(_BACKEND_HARDWARE, None, None, 0, ctypes.byref(self._handle))
        if status != _SUCCESS:  # no hardware backend on this GPU (ARCH_MISMATCH)
            self._handle = ctypes.c_void_p()
            return
        engines, cores = ctypes.c_uint(0), ctypes.c_uint(0)
        info = lib.nvjpegGetHardwareDecoderInfo(
            self._handle, ctypes.byref(engines), ctypes.byref(cores)
        )
        if info == _SUCCESS:
            self.engines, self.cores = engines.value, cores.value
        if (
            self.engines
            and lib.nvjpegJpegStreamCreate(self._handle, ctypes.byref(self._stream)) != _SUCCESS
        ):
            raise OSError("nvjpegJpegStreamCreate failed")

    @classmethod
    def open(cls, device: torch.device) -> NvjpegProbe | None:
        """The probe for ``device`` (torchvision's nvJPEG already loaded), or None where
        the library or a handle cannot be had (logged once at debug level)."""
        if device.type != "cuda":
            return None
        path = _loaded_nvjpeg()
        if path is None:
            log.debug("asyncloader: no libnvjpeg in this process: hardware decode unknown")
            return None
        try:
            with torch.cuda.device(device):
                return cls(ctypes.CDLL(path))
        except (OSError, AttributeError) as exc:
            log.debug("asyncloader: nvJPEG's hardware decoder not asked: %r", exc)
            return None

    def takes(self, jpeg: torch.Tensor) -> bool:
        """Whether nvJPEG's batched hardware decode takes ``jpeg`` (uint8, contiguous, on
        the CPU), as torchvision asks it: False without hardware engines."""
        if not self.engines:
            return False
        lib = self._lib
        if lib.nvjpegJpegStreamParseHeader(
            self._handle, jpeg.data_ptr(), jpeg.numel(), self._stream
        ):
            return False
        supported = ctypes.c_int(-1)
        if lib.nvjpegDecodeBatchedSupported(self._handle, self._stream, ctypes.byref(supported)):
            return False
        return supported.value == 0  # 0: supported
