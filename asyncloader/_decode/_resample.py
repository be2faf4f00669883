"""The GPU decode path's arithmetic, apart from its threads: which JPEGs nvJPEG gets (their
size from the markers alone), and Pillow's BILINEAR resize as matrices.

:func:`windows` says where Pillow's filter reads for each output pixel (on the host,
vectorised over the images of a group), :func:`weights` makes the dense filter matrices on
the device from that, and :func:`resample` applies them to one decoded image: two matrix
products, float32, the flip folded into the weights.  Against Pillow's resize of the same
decoded pixels, at most one level apart (Pillow rounds to 8 bits between its passes).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from .._base._types import Blob

__all__ = ["jpeg_header", "resample", "resize_weights", "weights", "windows"]

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


def windows(
    start: npt.NDArray[np.float64],
    end: npt.NDArray[np.float64],
    size: npt.NDArray[np.float64],
    out: int,
) -> npt.NDArray[np.float64]:
    """Where Pillow's BILINEAR filter reads, for ``[start, end)`` of axes of ``size`` pixels
    resized to ``out`` pixels (one axis of each of N images): [3, N, out] of each output
    pixel's centre in the source, and the first and end source pixel of its window.

    Pillow's ``precompute_coeffs`` (Resample.c): a triangle of radius ``max(scale, 1)``
    source pixels around the centre, clipped to the image (C's ``(int)`` truncates toward
    zero; below zero it is clipped to 0 either way).
    """
    scale = (end - start) / out
    support = np.maximum(scale, 1.0)[:, None]
    centre = start[:, None] + (np.arange(out, dtype=np.float64) + 0.5)[None, :] * scale[:, None]
    lo = np.clip(np.trunc(centre - support + 0.5), 0, size[:, None])
    hi = np.clip(np.trunc(centre + support + 0.5), 0, size[:, None])
    return np.stack([centre, lo, hi, np.broadcast_to(support, centre.shape)])


def weights(win: torch.Tensor, width: int, flip: torch.Tensor | None = None) -> torch.Tensor:
    """The filter's weights for :func:`windows` ``win`` (on any device): float32
    [N, out, width], where column ``k`` of image ``i`` is source pixel
    ``win[1, i, 0] + k``; rows reversed for the images where ``flip`` is True."""
    centre, lo, hi, support = win[0], win[1], win[2], win[3]
    first = lo[:, :1]
    x = first + torch.arange(width, dtype=win.dtype, device=win.device)[None, :]  # [N, width]
    d = (x[:, None, :] - centre[:, :, None] + 0.5) / support[:, :, None]
    w = torch.clamp(1.0 - d.abs(), min=0.0)
    w *= (x[:, None, :] >= lo[:, :, None]) & (x[:, None, :] < hi[:, :, None])
    total = w.sum(dim=2, keepdim=True)
    w /= torch.where(total == 0, 1.0, total)
    if flip is not None:
        w = torch.where(flip[:, None, None], w.flip(1), w)
    return w.float()


def resize_weights(
    start: float, end: float, size: int, out: int, *, flip: bool = False
) -> tuple[npt.NDArray[np.float32], int]:
    """Pillow's BILINEAR resize of ``[start, end)`` of an axis of ``size`` pixels to ``out``
    pixels, as a matrix: ``(weights [out, n], first)`` where output pixel ``i`` is
    ``sum_k weights[i, k] * source[first + k]``; rows reversed when ``flip``."""
    win = windows(np.array([start]), np.array([end]), np.array([float(size)]), out)
    first, n = int(win[1].min()), int(win[2].max() - win[1].min())
    w = weights(torch.from_numpy(win), n, torch.tensor([flip]))
    return w[0].numpy(), first


def resample(
    image: torch.Tensor, wx: torch.Tensor, x0: int, wy: torch.Tensor, y0: int
) -> torch.Tensor:
    """``image`` (uint8 [C, H, W]) cropped and resized by weights from :func:`weights`
    (``wx`` [out_w, nx] for columns from ``x0``, ``wy`` [out_h, ny] for rows from ``y0``):
    float32 [C, out_h, out_w], not rounded."""
    crop = image[:, y0 : y0 + wy.shape[1], x0 : x0 + wx.shape[1]].float()
    return torch.matmul(wy, torch.matmul(crop, wx.T))
