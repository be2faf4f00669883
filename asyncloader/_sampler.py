"""Which samples go into which batch: a pure function of the dataset size and the run's knobs.

No I/O, no global state: ``epoch_indices(n, seed=s, epoch=e, ...)`` is the same array on every
machine, every time.  Property-tested in ``tests/test_sampler.py``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["epoch_indices", "mix_seed", "num_batches"]

_MASK = (1 << 64) - 1

EvenPolicy = Literal["pad", "drop"]


def mix_seed(*values: int) -> int:
    """Hash integers into one 64-bit seed (splitmix64 over the sequence)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK)) & _MASK
        h = (h + 0x9E3779B97F4A7C15) & _MASK
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        h = z ^ (z >> 31)
    return h


def epoch_indices(
    n: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int = 0,
    world_size: int = 1,
    even: EvenPolicy = "pad",
) -> npt.NDArray[np.int64]:
    """Indices into the object list that ``rank`` visits in ``epoch``, in order.

    The epoch's global order is a seeded permutation of ``range(n)`` (or ``range(n)`` without
    shuffle); rank ``r`` takes positions ``r, r + world_size, ...``.  So that every rank gets
    the same count (an uneven count hangs DDP), ``even="pad"`` repeats samples from the start
    of the order to fill the last round, ``even="drop"`` drops the incomplete last round.

    Raises:
        ValueError: on an impossible rank/world size.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    if shuffle:
        rng = np.random.Generator(np.random.PCG64(mix_seed(seed, epoch)))
        order = rng.permutation(n).astype(np.int64)
    else:
        order = np.arange(n, dtype=np.int64)
    if world_size > 1:
        rem = n % world_size
        if rem and even == "pad" and n:
            # Repeat the order cyclically (a dataset smaller than the world repeats more
            # than once) up to the next multiple of the world size.
            order = np.resize(order, n + world_size - rem)
        elif rem:
            order = order[: n - rem]
        order = order[rank::world_size]
    return order


def num_batches(n_samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``n_samples``: the last one may be short unless ``drop_last``."""
    return n_samples // batch_size if drop_last else -(-n_samples // batch_size)
