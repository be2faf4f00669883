"""Which batches an engine makes, epoch after epoch: the sampler's order over a listing
that may still grow, this DataLoader worker's batches of the rank's share, and of those
this engine's part (:func:`~._sampler.batch_owner`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import numpy as np
import numpy.typing as npt

from .._base._config import RunConfig
from .._base._errors import AsyncLoaderError
from .._dataset import Listing
from ._sampler import batch_owner, epoch_indices, num_batches, samples_per_epoch, unshuffled_batch

__all__ = ["BatchOrder"]


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
        self._epoch_samples: int | None = None

    def epoch_samples(self) -> int:
        """Samples this rank sees per epoch (the same in every epoch); the listing must be
        complete."""
        if self._epoch_samples is None:
            dataset = self.listing.dataset
            if dataset is None:
                raise AsyncLoaderError("the listing is not complete yet")
            self._epoch_samples = samples_per_epoch(len(dataset.samples), self.run, dataset.mix)
        return self._epoch_samples

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
                f"{r.shard.num_workers} worker(s) sharing it"
            )

    async def batches(
        self, epoch: int, first_batch: int, span: tuple[int, int] | None = None
    ) -> AsyncGenerator[tuple[int, int, npt.NDArray[np.int64], bool], None]:
        """(epoch, index, sample indices, last of its epoch) from ``epoch`` on, endlessly.

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
                        yield epoch, b, sel, False
                    b += 1
                first_batch = b
                self.check()
            indices = epoch_indices(
                len(listing.samples),
                seed=r.seed,
                epoch=epoch,
                shuffle=r.shuffle,
                rank=r.rank,
                world_size=r.world_size,
                even=r.shard.even,
                local_world_size=r.shard.local_world_size,
                start=span[0] if span else 0,
                end=span[1] if span else None,
                mix=listing.dataset.mix if listing.dataset is not None else None,
            )
            span = None
            nb = num_batches(len(indices), r.batch_size, r.shard.drop_last)
            mine = [b for b in range(first_batch, nb) if self.mine(b)]
            for b in mine:
                sel = indices[b * r.batch_size : (b + 1) * r.batch_size]
                yield epoch, b, sel, b == mine[-1]
            if not mine:
                yield epoch, -1, indices[:0], True  # nothing (more) for this worker: END only
            first_batch = 0
            epoch += 1

    def mine(self, b: int) -> bool:
        """Whether batch ``b`` of the rank is made here: this DataLoader worker's, and of
        those this engine process's part."""
        k, n = self.part
        return batch_owner(b, self.run.shard.num_workers, n) == (self.run.shard.worker, k)
