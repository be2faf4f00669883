"""Aspect-ratio buckets (pure): the sizes a bucketed run's batches come in, which bucket
each image goes to, and the usual set made from a target area.

Diffusion and vision-language trainers batch by shape instead of cropping every image
square (SDXL's buckets, kohya's ``enable_bucket``): each image goes to the bucket whose
aspect ratio is nearest its own — on a log scale, so 2:1 and 1:2 are as far from 1:1 — is
resized to cover it and cropped to exactly its size, and every batch holds one bucket.
The planning of each crop is :func:`asyncloader._decode._transforms.bucket_plan`; the
epoch's batches, :func:`asyncloader._run._sampler.bucketed`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["CROP_TOP_LEFT", "GEOMETRY", "ORIGINAL_SIZE", "Buckets", "make_buckets"]

ORIGINAL_SIZE = "original_size"
"""The extra that gives each sample's size before its bucket's crop, ``(height, width)``
(SDXL's ``original_size``; a bucketed run's, filled in per batch)."""
CROP_TOP_LEFT = "crop_top_left"
"""The extra that gives each sample's crop corner in its resized image, ``(top, left)``
(SDXL's ``crop_top_left``; a bucketed run's, filled in per batch)."""
GEOMETRY = (ORIGINAL_SIZE, CROP_TOP_LEFT)
"""The extras of a bucketed run's crop geometry: asked for only with buckets."""


@dataclass(frozen=True, slots=True)
class Buckets:
    """The sizes of a bucketed run's batches, and how each image is cropped to its bucket.

    Attributes:
        sizes: ``(height, width)`` of each bucket [pixels]; a bucket's index is its place
            here.  Another :class:`Buckets` (``make_buckets``'s) gives its sizes.
        crop: ``"random"``: the crop's corner drawn from the sample's seed; ``"center"``:
            centred.
        hflip: Mirror left-right with probability 0.5 (drawn from the sample's seed).
    """

    sizes: tuple[tuple[int, int], ...]
    crop: Literal["random", "center"] = "random"
    hflip: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.sizes, Buckets):
            # Buckets(make_buckets(...), crop="center"): another set's sizes, cropped and
            # flipped as this one says.
            object.__setattr__(self, "sizes", self.sizes.sizes)
        if isinstance(self.sizes, (str, bytes)) or not self.sizes:
            raise ValueError(f"buckets: at least one (height, width) size, not {self.sizes!r}")
        sizes = []
        for size in self.sizes:
            if (
                not isinstance(size, (tuple, list))
                or len(size) != 2
                or not all(isinstance(v, (int, np.integer)) and v > 0 for v in size)
            ):
                raise ValueError(f"buckets: {size!r} is not a (height, width) of whole pixels")
            sizes.append((int(size[0]), int(size[1])))
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"buckets: a size given twice in {sizes}")
        if self.crop not in ("random", "center"):
            raise ValueError(f"buckets: crop must be 'random' or 'center', not {self.crop!r}")
        object.__setattr__(self, "sizes", tuple(sizes))

    @classmethod
    def of(cls, value: Buckets | Sequence[tuple[int, int]] | None) -> Buckets | None:
        """``buckets=`` as given: a :class:`Buckets`, the sizes alone (random crops, no
        flip), or None."""
        if value is None or isinstance(value, Buckets):
            return value
        return cls(tuple(value))  # type: ignore[arg-type]

    @property
    def max_pixels(self) -> int:
        """Pixels of the largest bucket: what every ring slot holds room for, per sample."""
        return max(h * w for h, w in self.sizes)

    def describe(self) -> str:
        """The canonical text of the buckets (a resume state keeps it: another set is
        another order)."""
        sizes = ",".join(f"{h}x{w}" for h, w in self.sizes)
        return f"{sizes} crop={self.crop} hflip={int(self.hflip)}"

    def nearest(self, heights: npt.ArrayLike, widths: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """For each image of ``heights`` × ``widths``, the bucket whose aspect ratio is
        nearest its own on a log scale (a tie: the bucket given first)."""
        h = np.asarray(heights, dtype=np.float64)
        w = np.asarray(widths, dtype=np.float64)
        if np.any(h <= 0) or np.any(w <= 0):
            raise ValueError("buckets: an image without a positive width and height")
        own = np.log(w / h)[:, None]
        theirs = np.log(np.array([bw / bh for bh, bw in self.sizes]))[None, :]
        nearest: npt.NDArray[np.int64] = np.argmin(np.abs(own - theirs), axis=1).astype(np.int64)
        return nearest


def make_buckets(
    area: int = 1024 * 1024,
    *,
    ratios: tuple[float, float] = (0.25, 4.0),
    step: int = 64,
    crop: Literal["random", "center"] = "random",
    hflip: bool = False,
) -> Buckets:
    """The usual bucket set, as SDXL's: every width a multiple of ``step``, each with the
    tallest height (a multiple of ``step``) that keeps ``height × width <= area``, whose
    aspect ratio ``width / height`` is within ``ratios``; sorted by that ratio.

    ``make_buckets(1024 * 1024)`` gives 1024 × 1024, 896 × 1152, 832 × 1216, …, down to
    4:1 and 1:4; ``make_buckets(512 * 512, ratios=(0.5, 2.0))`` a small set for tests.

    Raises:
        ValueError: no bucket fits (an area below ``step²``, or an empty ratio range).
    """
    lo, hi = ratios
    if not 0 < lo <= hi or area < step * step or step < 1:
        raise ValueError(f"make_buckets: no buckets for area={area}, ratios={ratios}, step={step}")
    sizes: set[tuple[int, int]] = set()
    for width in range(step, area // step + 1, step):
        height = (area // width) // step * step
        if height >= step and lo <= width / height <= hi:
            sizes.add((height, width))
    if not sizes:
        raise ValueError(f"make_buckets: no buckets for area={area}, ratios={ratios}, step={step}")
    ordered = sorted(sizes, key=lambda s: (s[1] / s[0], s[1]))
    # One size per aspect ratio where two round to the same: the larger area.
    best: dict[float, tuple[int, int]] = {}
    for h, w in ordered:
        r = round(math.log(w / h), 9)
        if r not in best or h * w > best[r][0] * best[r][1]:
            best[r] = (h, w)
    return Buckets(tuple(best[r] for r in sorted(best)), crop=crop, hflip=hflip)
