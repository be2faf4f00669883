"""The GPU decode path's arithmetic, apart from its threads: Pillow's BILINEAR resize as
matrices.

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

__all__ = ["resample", "resize_weights", "weights", "windows"]


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
