"""Geometric transforms, planned before decoding.

A transform does not touch pixels: from the source size and a per-sample random stream it
*plans* a crop box (in source pixels), an output size and a flip.  The decoder then uses
the plan to pick a JPEG draft scale, does crop+resize in one Pillow call, and applies the
flip for free while copying HWC pixels into the CHW batch slot.  Because the random stream is
seeded from (seed, epoch, place in the epoch's order), the same batch gets the same
augmentation wherever it decodes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CenterCrop", "Plan", "RandomResizedCrop", "Resize", "Transform", "bucket_plan"]

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one image: crop ``box`` (left, top, right, bottom in source pixels),
    resize to ``size`` (width, height), then mirror left-right if ``flip``."""

    box: Box
    size: tuple[int, int]
    flip: bool


class Transform(Protocol):
    """Plans the geometry of one sample; must be picklable (it travels to worker processes)."""

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of every output image [pixels]."""
        ...

    def plan(self, width: int, height: int, rng: random.Random) -> Plan:
        """Plan for a ``width`` × ``height`` source, drawing randomness only from ``rng``."""
        ...


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


@dataclass(frozen=True, slots=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop (+ optional horizontal flip) as a plan.

    Args:
        size: Output (height, width) or one int for a square [pixels].
        scale: Range of the crop's area as a fraction of the source area.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
        hflip: Mirror left-right with probability 0.5.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: bool = True

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def plan(self, width: int, height: int, rng: random.Random) -> Plan:
        h_out, w_out = self.output_size
        area = width * height
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        box: Box | None = None
        for _ in range(10):
            a, b, c, d = rng.random(), rng.random(), rng.random(), rng.random()
            target = area * (self.scale[0] + a * (self.scale[1] - self.scale[0]))
            aspect = math.exp(log_lo + b * (log_hi - log_lo))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                left = int(c * (width - w + 1))
                top = int(d * (height - h + 1))
                box = (left, top, left + w, top + h)
                break
        if box is None:
            # Fallback, as torchvision: the largest central crop within the ratio range.
            in_ratio = width / height
            if in_ratio < self.ratio[0]:
                w, h = width, round(width / self.ratio[0])
            elif in_ratio > self.ratio[1]:
                h, w = height, round(height * self.ratio[1])
            else:
                w, h = width, height
            left, top = (width - w) // 2, (height - h) // 2
            box = (left, top, left + w, top + h)
        return Plan(box, (w_out, h_out), self.hflip and rng.random() < 0.5)


@dataclass(frozen=True, slots=True)
class Resize:
    """Resize the shorter side to ``resize`` and centre-crop ``size`` (the evaluation recipe).

    Done as one crop+resize: the centre box in source pixels that maps onto ``size``.

    Args:
        size: Output (height, width) or one int [pixels].
        resize: Shorter side after resizing, before the crop; default ``size`` (no crop
            beyond the aspect-ratio one) [pixels].
        hflip: Mirror left-right with probability 0.5 (for training with a fixed crop).
    """

    size: int | tuple[int, int]
    resize: int | None = None
    hflip: bool = False

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def plan(self, width: int, height: int, rng: random.Random) -> Plan:
        h_out, w_out = self.output_size
        short = self.resize or min(h_out, w_out)
        scale = short / min(width, height)  # source → resized
        cw, ch = min(w_out / scale, width), min(h_out / scale, height)
        left, top = (width - cw) / 2, (height - ch) / 2
        return Plan(
            (left, top, left + cw, top + ch), (w_out, h_out), self.hflip and rng.random() < 0.5
        )


def CenterCrop(size: int | tuple[int, int], resize: int | None = None) -> Resize:
    """Resize + CenterCrop, the torchvision evaluation pair (``resize`` defaults to size/0.875)."""
    h, w = _pair(size)
    return Resize(size, resize if resize is not None else round(min(h, w) / 0.875))


def bucket_plan(
    width: int,
    height: int,
    size: tuple[int, int],
    rng: random.Random,
    *,
    crop: str = "random",
    hflip: bool = False,
) -> tuple[Plan, tuple[int, int]]:
    """The plan that resizes a ``width`` × ``height`` image to cover the bucket ``size``
    (height, width) and crops it to exactly that size — a random corner drawn from ``rng``
    or (``crop="center"``) the centred one — flipped with probability 0.5 under ``hflip``;
    and the crop's ``(top, left)`` in the resized image (SDXL's ``crop_top_left``).

    One crop+resize, as every plan: the box in source pixels that maps onto the bucket.
    """
    bh, bw = size
    scale = max(bw / width, bh / height)  # source → resized: covers the bucket
    rw, rh = max(bw, round(width * scale)), max(bh, round(height * scale))
    if crop == "center":
        left, top = (rw - bw) // 2, (rh - bh) // 2
    else:
        left, top = rng.randint(0, rw - bw), rng.randint(0, rh - bh)
    # The box in source pixels, within the image (the resized size was rounded).
    sx, sy = width / rw, height / rh
    box = (left * sx, top * sy, (left + bw) * sx, (top + bh) * sy)
    return Plan(box, (bw, bh), hflip and rng.random() < 0.5), (top, left)
