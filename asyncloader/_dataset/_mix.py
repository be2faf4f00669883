"""Several sources in one dataset: how many samples each gives an epoch (pure).

The dataset's samples are the sources' samples one source after the other (source ``s``
holds indices ``offsets[s] … offsets[s] + sizes[s] - 1``).  An epoch has
``samples_per_epoch`` samples (default: the sum of the sizes), shared among the sources by
weight: source ``s`` gives ``quotas[s]`` of them, the largest-remainder rounding of
``samples_per_epoch × weight[s] / Σ weights``, so the quotas add up exactly.  Without
weights each source gives its size (every sample once an epoch) — scaled to
``samples_per_epoch`` when that is given.  Which samples, and in what order, is the
sampler's (:func:`asyncloader._run._sampler.mixed_order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Mix", "quotas"]


@dataclass(frozen=True, slots=True)
class Mix:
    """The sources of a dataset and their share of an epoch.

    Attributes:
        urls: Each source's URL (as its store names it).
        sizes: Each source's sample count.
        quotas: Each source's samples per epoch.
    """

    urls: tuple[str, ...]
    sizes: tuple[int, ...]
    quotas: tuple[int, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        """The index of each source's first sample in the dataset."""
        return tuple(int(x) for x in np.cumsum((0, *self.sizes[:-1])))

    @property
    def length(self) -> int:
        """Samples per epoch."""
        return sum(self.quotas)

    def describe(self) -> str:
        """The sizes and quotas as text (a resume state's ``mix``)."""
        return "sizes {} quotas {}".format(
            *(",".join(map(str, v)) for v in (self.sizes, self.quotas))
        )

    def count(self, indices: Sequence[int] | np.ndarray) -> dict[str, int]:
        """How many of the sample ``indices`` each source gave (by its URL)."""
        found = np.bincount(self.source_of(indices), minlength=len(self.urls))
        out: dict[str, int] = {}
        for url, n in zip(self.urls, found.tolist(), strict=True):
            if n:  # a URL given twice (to weigh it up) counts as one source
                out[url] = out.get(url, 0) + n
        return out

    def source_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The source of each sample index."""
        return np.searchsorted(np.cumsum(self.sizes), np.asarray(indices), side="right")


def quotas(
    sizes: Sequence[int], weights: Sequence[float] | None, samples_per_epoch: int | None
) -> tuple[int, ...]:
    """Each source's samples per epoch (see the module's docstring).

    Raises:
        ValueError: a negative or all-zero weight, an empty source that is given a share,
            a ``samples_per_epoch`` below 1.
    """
    total = sum(sizes) if samples_per_epoch is None else samples_per_epoch
    if total < 1:
        raise ValueError(f"samples_per_epoch must be at least 1, not {total}")
    shares = [float(s) for s in sizes] if weights is None else [float(w) for w in weights]
    if any(w < 0 or w != w for w in shares) or not sum(shares):
        raise ValueError(f"weights must be >= 0 and not all 0: {list(shares)}")
    exact = [total * w / sum(shares) for w in shares]
    out = [int(x) for x in exact]
    # Largest remainders first (ties: the earlier source), until the quotas add up.
    order = sorted(range(len(exact)), key=lambda s: (-(exact[s] - out[s]), s))
    for s in order[: total - sum(out)]:
        out[s] += 1
    for s, (q, n) in enumerate(zip(out, sizes, strict=True)):
        if q and not n:
            raise ValueError(f"source {s} has no samples to give its share of {q}")
    return tuple(out)
