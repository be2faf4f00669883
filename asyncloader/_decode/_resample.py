"""The GPU decode path's arithmetic, apart from its threads: Pillow's BILINEAR resize as
matrices.

:func:`windows` says where Pillow's filter reads for each output pixel (on the host,
vectorised over the images of a group), :func:`weights` makes the dense filter matrices on
the device from that, :func:`crops` gathers the part of each decoded image that its
weights read into one padded tensor, and :func:`resample` applies the weights to the whole
group at once: two batched matrix products, float32, the flip folded into the weights.  A
group costs the same few kernel launches however many images it holds (the training
process's CPU per image is what GPU decode is for).  Against Pillow's resize of the same
decoded pixels, at most one level apart (Pillow rounds to 8 bits between its passes).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["crops", "resample", "spans", "weights", "windows"]


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


def spans(win: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The source pixels each image's outputs read, from :func:`windows` ``win``: the first
    one and how many, [N] each (the windows move only forward along an axis)."""
    first = win[1].min(axis=1)
    return first.astype(np.int64), (win[2].max(axis=1) - first).astype(np.int64)


def weights(win: torch.Tensor, width: int, flip: torch.Tensor | None = None) -> torch.Tensor:
    """The filter's weights for :func:`windows` ``win`` (on any device): float32
    [N, out, width], where column ``k`` of image ``i`` is source pixel
    ``win[1, i, 0] + k``; rows reversed for the images where ``flip`` is True.  Columns
    past an image's own span (:func:`spans`) weigh 0."""
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


def crops(flat: torch.Tensor, place: torch.Tensor, kx: int, ky: int) -> torch.Tensor:
    """Each image's ``ky`` rows × ``kx`` columns from its span's first pixel, in one
    gather: uint8 [C, N, ky, kx].

    ``flat`` (uint8 [C, total]) holds the images' planes one after another, each row by
    row; ``place`` (int64 [5, N], on ``flat``'s device) says, for each image, where its
    first pixel is in ``flat``, its width and height, and its span's first column and row
    (:func:`spans`).  Past an image's edge the gather repeats its last row or column:
    pixels that only columns of weight 0 read (:func:`weights`).
    """
    base, width, height, x0, y0 = place
    rows = torch.arange(ky, device=flat.device)[None, :] + y0[:, None]
    cols = torch.arange(kx, device=flat.device)[None, :] + x0[:, None]
    rows = torch.minimum(rows, (height - 1)[:, None])
    cols = torch.minimum(cols, (width - 1)[:, None])
    at = (base[:, None] + rows * width[:, None])[:, :, None] + cols[:, None, :]  # [N, ky, kx]
    return flat[:, at]


def resample(crop: torch.Tensor, wx: torch.Tensor, wy: torch.Tensor) -> torch.Tensor:
    """Crops from :func:`crops` (uint8 [C, N, ky, kx]) resized by weights from
    :func:`weights` (``wx`` [N, out_w, kx], ``wy`` [N, out_h, ky]): float32
    [N, C, out_h, out_w] (a view), not rounded; two batched matrix products."""
    return torch.matmul(wy, torch.matmul(crop.float(), wx.transpose(1, 2))).transpose(0, 1)
