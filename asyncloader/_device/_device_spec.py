"""What the training loop receives: the device, dtype, normalisation and layout of its
batches, and the conversion from uint8 that makes them (a leaf over torch).

Normalisation is ``(x * (1 / (255 * std))) + (-mean / std)`` in float32 — two separate
element-wise operations, each rounded once, identically on CPU and GPU — then a cast to the
output dtype.  On a GPU in two passes over the batch (the uint8 → float32 widening, exact,
inside the multiplication; the cast inside the addition); on the CPU, where mixed-dtype
kernels are slow, as three or four same-dtype passes.  Both round the same way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._base._config import IMAGENET_MEAN, IMAGENET_STD
from .._base._env import local_rank

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "DeviceSpec", "resolve_device"]

log = logging.getLogger("asyncloader")


_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "uint8": torch.uint8,
}


def resolve_device(device: str | torch.device) -> torch.device:
    """``"cuda"`` → this process's GPU (``LOCAL_RANK`` under torchrun, else the current one);
    a CUDA device without CUDA available → CPU, with a warning, so the same code runs
    everywhere."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        log.warning("asyncloader: device=%r but CUDA is not available; using the CPU", device)
        return torch.device("cpu")
    if dev.index is None:
        local = local_rank()
        index = local if local is not None else torch.cuda.current_device()
        dev = torch.device("cuda", index % torch.cuda.device_count())
    return dev


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """What the training loop receives: where, which dtype, how normalised, which layout.

    Attributes:
        device: Resolved device.
        dtype: Output dtype (``torch.uint8`` skips normalisation: a plain device copy).
        mean, std: Per-channel, on the 0..1 scale (torchvision's convention).
        channels_last: Return images in ``torch.channels_last`` memory format.
    """

    device: torch.device
    dtype: torch.dtype = torch.float32
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    channels_last: bool = False

    @classmethod
    def make(
        cls,
        device: str | torch.device,
        dtype: str | torch.dtype = "float32",
        mean: Sequence[float] | None = IMAGENET_MEAN,
        std: Sequence[float] | None = IMAGENET_STD,
        channels_last: bool = False,
    ) -> DeviceSpec:
        """Validate and resolve the loader's ``device=``/``dtype=``/``mean=``/``std=`` options.

        ``mean=None``/``std=None``: 0 and 1, i.e. only scaled to 0..1.

        Raises:
            ValueError: an unknown dtype, or mean/std of different lengths or a zero std.
        """
        if isinstance(dtype, str):
            if dtype not in _DTYPES:
                raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, not {dtype!r}")
            dtype = _DTYPES[dtype]
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported output dtype {dtype}")
        m = tuple(float(x) for x in (mean if mean is not None else (0.0,)))
        s = tuple(float(x) for x in (std if std is not None else (1.0,)))
        if len(m) != len(s):
            raise ValueError(f"mean and std need one value per channel: {m} vs {s}")
        if any(x == 0 for x in s):
            raise ValueError("std must not contain 0")
        return cls(resolve_device(device), dtype, m, s, channels_last)

    def affine(self, channels: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, shift)`` of shape [1, C, 1, 1], float32, on ``device``."""

        def per_channel(values: tuple[float, ...]) -> torch.Tensor:
            if len(values) not in (1, channels):
                raise ValueError(f"mean/std have {len(values)} values for {channels} channels")
            v = torch.tensor(values * (channels if len(values) == 1 else 1), dtype=torch.float64)
            return v

        mean, std = per_channel(self.mean), per_channel(self.std)
        scale = (1.0 / (255.0 * std)).to(torch.float32).view(1, channels, 1, 1)
        shift = (-mean / std).to(torch.float32).view(1, channels, 1, 1)
        return scale.to(device), shift.to(device)

    def empty(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """An uninitialised output batch of this spec's dtype and layout."""
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return torch.empty(shape, dtype=self.dtype, device=device, memory_format=fmt)

    def nbytes(self, shape: torch.Size) -> int:
        """Bytes of an output batch of ``shape``."""
        return math.prod(shape) * self.dtype.itemsize

    def over(self, raw: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """An output batch of ``shape`` (this spec's dtype and layout) over the bytes ``raw``
        (uint8, 1-D, at least :meth:`nbytes` long)."""
        flat = raw[: self.nbytes(shape)].view(self.dtype)
        if not self.channels_last:
            return flat.view(shape)
        b, c, h, w = shape
        return flat.view(b, h, w, c).permute(0, 3, 1, 2)

    def convert(
        self,
        images: torch.Tensor,
        affine: tuple[torch.Tensor, torch.Tensor],
        out: torch.Tensor | None = None,
        scratch: torch.Tensor | None = None,
        fused: bool | None = None,
    ) -> torch.Tensor:
        """uint8 [B,C,H,W] on the target device → the output batch, written into ``out``
        (and, for 16-bit outputs, through the float32 ``scratch``) when given: the same
        roundings on CPU and GPU, so both give the same bits.  ``fused`` chooses the
        two-pass form (default: on a GPU) or the four-pass one (default: on the CPU)."""
        if self.dtype == torch.uint8:
            if out is None:  # already a copy of its own (on a device): only the layout
                fmt = torch.channels_last if self.channels_last else torch.contiguous_format
                return images.contiguous(memory_format=fmt)
            return out.copy_(images)
        if out is None:
            out = self.empty(images.shape, images.device)
        if self.dtype == torch.float32:
            x = out
        elif scratch is not None:
            x = scratch
        else:
            x = torch.empty(images.shape, dtype=torch.float32, device=images.device)
        # Either way the widening is exact, the product and the sum are each rounded once
        # in float32, then cast to the output's dtype: the same bits.
        if fused is None:
            fused = images.device.type != "cpu"
        if fused:
            # Two passes: the widening inside the multiplication, the cast inside the
            # addition.  On a GPU the fewer passes over memory win.
            torch.mul(images, affine[0], out=x)
            return torch.add(x, affine[1], out=out)
        # On the CPU mixed-dtype kernels take a slow casting path (3-4x the time of these
        # same-dtype passes, measured on 128x3x224x224 batches).
        x.copy_(images)
        x.mul_(affine[0])
        x.add_(affine[1])
        return out if x is out else out.copy_(x)
