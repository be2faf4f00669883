"""Which batches an engine makes, epoch after epoch: the sampler's order over a listing
that may still grow, this DataLoader worker's batches of the rank's share, and of those
this engine's part (:func:`~._sampler.batch_owner`).  A bucketed run's batches also have
their geometry (:class:`Geometry`): each batch's shape and each sample's crop — planned
here from the recorded size and the sample's seed, exactly as its decode worker plans it
from the image (which must have that size) — for the ``original_size`` and
``crop_top_left`` extras."""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._base._buckets import CROP_TOP_LEFT, GEOMETRY, ORIGINAL_SIZE, Buckets
from .._base._config import RunConfig
from .._base._errors import AsyncLoaderError
from .._dataset import Listing
from .._dataset._labels import Dataset
from .._dataset._sizes import bucket_index, unmarked
from .._decode._transforms import bucket_plan
from ._sampler import (
    batch_owner,
    num_batches,
    run_deal,
    samples_per_epoch,
    unshuffled_batch,
)

__all__ = ["BatchOrder", "Geometry", "Mark", "batch_geometry"]


class BatchOrder:
    """The batches of ``listing`` that one engine makes.

    Args:
        listing: The samples (complete, or still growing for an unshuffled run).
        run: The order, the shard, the DataLoader worker.
        part: ``(k, n)``: every ``n``-th of this worker's batches, from its ``k``-th on
            (one of ``n`` engine processes); ``(0, 1)``: all of them.
    """

    def __init__(self, listing: Listing, run: RunConfig, part: tuple[int, int] = (0, 1)) -> None:
        self.listing = listing
        self.run = run
        self.part = part
        self._epoch_samples: dict[int, int] = {}
        self._bucket_of: npt.NDArray[np.int64] | None = None

    @property
    def bucket_of(self) -> npt.NDArray[np.int64] | None:
        """Each sample's aspect-ratio bucket (a bucketed run; the listing complete), else
        None."""
        buckets, dataset = self.run.buckets, self.listing.dataset
        if buckets is None or dataset is None:
            return None
        if self._bucket_of is None:
            self._bucket_of = bucket_index(dataset, buckets)
        return self._bucket_of

    def epoch_samples(self, epoch: int = 0) -> int:
        """Samples this rank sees in ``epoch`` (the same in every epoch but for a bucketed
        mix's); the listing must be complete."""
        key = epoch if self.run.buckets is not None and self.listing.dataset is not None else 0
        if key not in self._epoch_samples:
            dataset = self.listing.dataset
            if dataset is None:
                raise AsyncLoaderError("the listing is not complete yet")
            if len(self._epoch_samples) > 4:  # a bucketed mix's: the recent epochs only
                self._epoch_samples.clear()
            self._epoch_samples[key] = samples_per_epoch(
                len(dataset.samples), self.run, dataset.mix, buckets=self.bucket_of, epoch=key
            )
        return self._epoch_samples[key]

    def slots_for(self, slots: int) -> int:
        """How many of a ring's ``slots`` the engine uses: no more than it makes batches
        per epoch (at least 2: one filling, one the trainer holds), so that a small dataset
        is not fetched several epochs ahead of a run that may read only one; all of them
        while the listing still grows."""
        if self.listing.dataset is None:
            return slots
        r = self.run
        batches = num_batches(self.epoch_samples(), r.batch_size, r.shard.drop_last)
        return min(slots, max(2, sum(map(self.mine, range(batches)))))

    def check(self) -> None:
        """Every worker sharing this rank must get a batch (the listing is complete).

        Raises:
            ValueError: fewer batches per epoch than workers.
        """
        r = self.run
        n = self.epoch_samples()
        batches = num_batches(n, r.batch_size, r.shard.drop_last)
        if batches < r.shard.num_workers:
            raise ValueError(
                f"{batches} batches per epoch for this rank ({n} samples, "
                f"batch_size={r.batch_size}, drop_last={r.shard.drop_last}): fewer than the "
                f"{r.shard.num_workers} worker(s) sharing it{self._bucketed_why()}"
            )

    def _bucketed_why(self) -> str:
        """Why a bucketed run has so few batches, for :meth:`check`'s message ("" for a
        run without buckets)."""
        buckets, at = self.run.buckets, self.bucket_of
        if buckets is None or at is None or len(at) == 0:
            return ""
        counts = np.bincount(unmarked(at), minlength=len(buckets.sizes))
        k = int(counts.argmax())
        h, w = buckets.sizes[k]
        return (
            f". A bucketed epoch is made of whole batches of one bucket each, what a bucket "
            f"leaves over left out: of the dataset's {len(at)} samples, the fullest of its "
            f"{int((counts > 0).sum())} buckets in use ({h}x{w}) holds {int(counts[k])}. A "
            "smaller batch_size, or fewer buckets (a larger make_buckets(step=)), keeps more"
        )

    async def batches(
        self, epoch: int, first_batch: int, span: tuple[int, int] | None = None
    ) -> AsyncGenerator[tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64], bool], None]:
        """(epoch, index, sample indices, their places in the epoch's order, last of its
        epoch) from ``epoch`` on, endlessly (a sample's seed is made from its place: see
        :func:`~._sampler.epoch_deal`).

        Only the batches made here (:meth:`mine`); in the first epoch only from
        ``first_batch`` on (a resume).  Every epoch ends with an END marker, so the "last"
        flag goes with this worker's last batch.  While the listing still grows
        (an unshuffled run), each batch starts as soon as its samples are listed.  ``span``
        (the first epoch only): the positions of its order left to deal.
        """
        r = self.run
        listing = self.listing
        if span is not None:  # the rest of a resumed epoch: dealt from the whole list
            await listing.complete()
        while True:
            if not listing.done:
                b = first_batch
                while True:
                    await listing.wait((b + 1) * r.batch_size * r.world_size)
                    if listing.done:
                        break
                    if self.mine(b):
                        sel = unshuffled_batch(
                            b, r.batch_size, rank=r.rank, world_size=r.world_size
                        )
                        # Unshuffled, a sample's place in the order is its index.
                        yield epoch, b, sel, sel, False
                    b += 1
                first_batch = b
                self.check()
            indices, places = run_deal(
                len(listing.samples),
                r,
                epoch=epoch,
                mix=listing.dataset.mix if listing.dataset is not None else None,
                buckets=self.bucket_of,
                span=span,
            )
            span = None
            nb = num_batches(len(indices), r.batch_size, r.shard.drop_last)
            mine = [b for b in range(first_batch, nb) if self.mine(b)]
            for b in mine:
                part = slice(b * r.batch_size, (b + 1) * r.batch_size)
                yield epoch, b, indices[part], places[part], b == mine[-1]
            if not mine:
                # Nothing (more) for this worker: END only.
                yield epoch, -1, indices[:0], places[:0], True
            first_batch = 0
            epoch += 1

    def mine(self, b: int) -> bool:
        """Whether batch ``b`` of the rank is made here: this DataLoader worker's, and of
        those this engine process's part."""
        k, n = self.part
        return batch_owner(b, self.run.shard.num_workers, n) == (self.run.shard.worker, k)


Mark = tuple[int, int, int, int]
"""What a decode job of a bucketed batch is told: the bucket's height and width, and the
image's recorded height and width (its decode checks them)."""


class Geometry:
    """The shapes and crops of a bucketed run's batches.

    Args:
        buckets: The run's buckets.
        sizes: Each sample's recorded ``(height, width)``.
        bucket_of: Each sample's bucket, as :func:`~.._dataset._sizes.bucket_index`
            marks it.
    """

    def __init__(
        self,
        buckets: Buckets,
        sizes: npt.NDArray[np.int64],
        bucket_of: npt.NDArray[np.int64],
    ) -> None:
        self.buckets = buckets
        self.sizes = sizes
        self.bucket_of = bucket_of

    @classmethod
    def of(
        cls, run: RunConfig, dataset: Dataset | None, bucket_of: npt.NDArray[np.int64] | None
    ) -> Geometry | None:
        """A bucketed run's geometry over ``dataset`` (complete: a bucketed run never
        streams), else None."""
        if run.buckets is None or dataset is None or dataset.sizes is None or bucket_of is None:
            return None
        return cls(run.buckets, dataset.sizes, bucket_of)

    def shape(self, indices: Sequence[int]) -> tuple[int, int]:
        """``(height, width)`` of the batch of samples ``indices`` (one bucket)."""
        return self.buckets.sizes[int(unmarked(self.bucket_of[indices[:1]])[0])]

    def marks(self, indices: Sequence[int]) -> list[Mark]:
        """Each sample's :data:`Mark`, in batch order."""
        bh, bw = self.shape(indices)
        return [(bh, bw, int(self.sizes[i, 0]), int(self.sizes[i, 1])) for i in indices]

    def extras(
        self, names: Sequence[str], indices: Sequence[int], seeds: Sequence[int]
    ) -> dict[str, Any]:
        """Of ``names``, the geometry extras of the samples ``indices``, each drawn as its
        decode draws it: from its seed of ``seeds`` (:func:`~._sampler.sample_seeds`)."""
        out: dict[str, list[Any]] = {n: [] for n in names if n in GEOMETRY}
        if not out:
            return out
        size = self.shape(indices)
        b = self.buckets
        for i, seed in zip(indices, seeds, strict=True):
            h, w = int(self.sizes[i, 0]), int(self.sizes[i, 1])
            # An image of unknown size fails when its batch reads it: no crop drawn.
            corner = (0, 0)
            if h > 0 and w > 0:
                rng = random.Random(seed)
                _, corner = bucket_plan(w, h, size, rng, crop=b.crop, hflip=b.hflip)
            if ORIGINAL_SIZE in out:
                out[ORIGINAL_SIZE].append((h, w))
            if CROP_TOP_LEFT in out:
                out[CROP_TOP_LEFT].append(corner)
        return out


def batch_geometry(
    geometry: Geometry | None, indices: Sequence[int]
) -> tuple[tuple[int, int] | None, list[Mark | None]]:
    """The shape of the batch of samples ``indices`` and each sample's :data:`Mark`; for a
    run without buckets, None and None each."""
    if geometry is None:
        return None, [None] * len(indices)
    return geometry.shape(indices), list(geometry.marks(indices))
