"""Which samples go into which batch: a pure function of the dataset size and the run's knobs.

No I/O, no global state: ``epoch_indices(n, seed=s, epoch=e, ...)`` is the same array on every
machine, every time.  Property-tested in ``tests/test_sampler.py``.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .._base._config import RunConfig
from .._dataset._mix import Mix

__all__ = [
    "batch_owner",
    "bucketed",
    "consumed_prefix",
    "covered",
    "epoch_deal",
    "epoch_indices",
    "mix_seed",
    "mixed_order",
    "node_subset",
    "num_batches",
    "run_deal",
    "sample_seeds",
    "samples_per_epoch",
    "unshuffled_batch",
]

_MASK = (1 << 64) - 1
_NODE_SALT = 0x6E6F6465  # separates the node partition's seed from the epochs' seeds
_MIX_SALT = 0x6D6978  # separates a mix's seeds (its pattern, each source's cycles)
MIX_BLOCK = 8
"""A mix's pattern is shuffled within blocks of this many positions (see :func:`mixed_order`)."""

EvenPolicy = Literal["pad", "drop"]
Shuffle = bool | Literal["global", "node"]


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


def sample_seeds(seed: int, epoch: int, places: npt.ArrayLike) -> list[int]:
    """Each sample's seed in ``epoch``, from its place in the epoch's order (``places``, as
    :func:`epoch_deal` gives them) and the loader's ``seed``: what the built-in transforms
    and a bucket's crop draw from, what a decode hook with a ``seed`` parameter and
    ``extras=("seed",)`` receive.  A sample drawn twice in an epoch (a mix's repeats, the
    padding) draws anew each time; the same place gets the same seed under any world size,
    DataLoader worker or engine count, and after a resume."""
    return [mix_seed(seed, epoch, int(p)) for p in np.asarray(places).tolist()]


def _even(order: npt.NDArray[np.int64], parts: int, even: EvenPolicy) -> npt.NDArray[np.int64]:
    """``order`` made a multiple of ``parts`` long: repeated cyclically from its start (a
    list shorter than ``parts`` repeats more than once) or cut at the last full round."""
    n = len(order)
    rem = n % parts
    if not rem:
        return order
    if even == "pad" and n:  # rows (a bucketed epoch's batches) repeat whole
        return np.resize(order, (n + parts - rem, *order.shape[1:]))
    return order[: n - rem]


def _permutation(n: int, seed: int) -> npt.NDArray[np.int64]:
    return np.random.Generator(np.random.PCG64(seed)).permutation(n).astype(np.int64)


def node_subset(n: int, *, seed: int, node: int, nodes: int) -> npt.NDArray[np.int64]:
    """The indices node ``node`` of ``nodes`` keeps in every epoch of node-local shuffling:
    a seeded, epoch-independent partition (sizes differ by at most one), sorted."""
    if nodes < 1 or not 0 <= node < nodes:
        raise ValueError(f"node {node} is not one of {nodes}")
    return np.sort(_permutation(n, mix_seed(seed, _NODE_SALT))[node::nodes])


def mixed_order(mix: Mix, *, seed: int, epoch: int, shuffle: bool) -> npt.NDArray[np.int64]:
    """The order of ``epoch`` over several sources: ``mix.length`` sample indices.

    Each source's samples come from its own endless sequence of permutations (seeded by
    the source and the cycle; listing order unshuffled), and epoch ``e`` takes the next
    ``quota`` of them: positions ``e·quota … (e+1)·quota`` of that sequence.  A source whose
    quota is its size gives every sample once; a larger quota repeats (a new permutation
    starts), a smaller one gives a different part each epoch, so that all come round.

    Where each source's samples go: the ``k``-th of a source with quota ``q`` is placed at
    ``(k + ½)·L/q`` (L: the epoch's length), so that every window holds each source's share
    to within a sample or two; then the sources' places are shuffled within blocks of
    :data:`MIX_BLOCK` positions (seeded by the epoch), so that the ranks of a world, which
    take positions ``r, r + W, …``, get the shares too (to within a block's chance) whatever
    ``W`` is.  Independent of the world size: an epoch resumed elsewhere deals the rest of
    the same order.
    """
    length = mix.length
    which = np.concatenate([np.full(q, s, np.int64) for s, q in enumerate(mix.quotas)])
    place = np.concatenate([(np.arange(q) + 0.5) / q for q in mix.quotas])
    pattern = which[np.lexsort((which, place))]
    rng = np.random.Generator(np.random.PCG64(mix_seed(seed, epoch, _MIX_SALT)))
    full = length - length % MIX_BLOCK
    pattern[:full] = rng.permuted(pattern[:full].reshape(-1, MIX_BLOCK), axis=1).ravel()
    pattern[full:] = rng.permutation(pattern[full:])
    out = np.empty(length, np.int64)
    for s, (n, q, first) in enumerate(zip(mix.sizes, mix.quotas, mix.offsets, strict=True)):
        if q:
            out[pattern == s] = first + _draws(n, q, epoch, mix_seed(seed, _MIX_SALT, s), shuffle)
    return out


def _draws(n: int, quota: int, epoch: int, seed: int, shuffle: bool) -> npt.NDArray[np.int64]:
    """Positions ``epoch·quota … (epoch+1)·quota`` of a source's endless sequence of
    permutations of ``range(n)`` (cycle ``c`` seeded by ``(seed, c)``; ``range(n)`` itself
    unshuffled)."""
    start, end = epoch * quota, (epoch + 1) * quota
    cycles = range(start // n, (end - 1) // n + 1)
    seq = np.concatenate(
        [_permutation(n, mix_seed(seed, c)) if shuffle else np.arange(n) for c in cycles]
    )
    first = cycles[0] * n
    return seq[start - first : end - first].astype(np.int64)


def batch_owner(batch: int, num_workers: int, engines: int) -> tuple[int, int]:
    """Who makes batch ``batch`` of a rank's epoch: its DataLoader worker (of
    ``num_workers``: batches ``w, w + num_workers, …``), and which of that worker's
    ``engines`` engine processes (every ``engines``-th of the worker's batches)."""
    return batch % num_workers, (batch // num_workers) % engines


def epoch_indices(n: int, **options: Any) -> npt.NDArray[np.int64]:
    """Indices into the object list that a rank visits in an epoch, in order: the first of
    :func:`epoch_deal`'s pair, for the same keywords (see there)."""
    return epoch_deal(n, **options)[0]


def epoch_deal(
    n: int,
    *,
    seed: int,
    epoch: int,
    shuffle: Shuffle,
    rank: int = 0,
    world_size: int = 1,
    even: EvenPolicy = "pad",
    local_world_size: int | None = None,
    start: int = 0,
    end: int | None = None,
    mix: Mix | None = None,
    buckets: tuple[npt.NDArray[np.int64], int] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Indices into the object list that ``rank`` visits in ``epoch``, in order, and each
    one's place in the epoch's order (what its seed is made from: see below).

    Global shuffle (``True``/``"global"``; ``False``: listing order): the epoch's order is a
    seeded permutation of ``range(n)`` and rank ``r`` takes positions ``r, r + world_size,
    ...``.

    Node-local shuffle (``"node"``): the ranks are ``world_size // local_world_size`` nodes
    of ``local_world_size`` consecutive ranks.  Each node keeps the same subset in every
    epoch (:func:`node_subset`), so its SSD cache only ever holds about 1/nodes of the data;
    each epoch it permutes that subset anew and deals it to its ranks.  The trade-off: a
    sample only ever meets the other samples of its node in a batch, and the order is
    random within a node only — fine for large datasets, worse for small or sorted ones.

    So that every rank gets the same count (an uneven count hangs DDP), ``even="pad"``
    repeats samples from the start of the order to fill the last round, ``even="drop"``
    leaves out the incomplete last round (for node-local: per node first, then per rank).

    ``start``, ``end`` (global shuffle or none): deal only positions ``[start, end)`` of the
    epoch's order — the rest of an epoch resumed with another world size (see
    :func:`consumed_prefix`).

    ``mix`` (several sources, or a ``samples_per_epoch``): the epoch's order is
    :func:`mixed_order`'s, dealt to the ranks as a permutation is.

    ``buckets``: ``(bucket_of, batch_size)``, each sample's aspect-ratio bucket: the order is
    regrouped into batches of one bucket (:func:`bucketed`) and the ranks take whole
    batches, rank ``r`` batches ``r, r + world_size, ...`` (``even`` pads with whole batches
    or drops the last round); ``start``/``end`` are then positions of the regrouped order,
    at batch boundaries.

    The places: a sample's position in the epoch's order (the regrouped one, bucketed),
    the same for any world size, DataLoader worker or engine count, and kept by a resume
    (``start`` counts); the padding of ``even="pad"`` takes the places after the order's
    end, so a sample repeated there, or drawn twice by a mix, has another place each time.
    Node-local: node ``k``'s order takes places from ``k · (its length + local_world_size)``
    on, so that no two nodes share one.

    Raises:
        ValueError: on an impossible rank, world size or node layout.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    if shuffle == "node" and mix is not None:
        raise ValueError("node-local shuffle reads one source, a whole epoch at a time")
    if shuffle == "node" and buckets is not None:
        raise ValueError("aspect-ratio buckets need a global shuffle (or none)")
    if shuffle == "node" and (start or end is not None):
        raise ValueError("node-local shuffle deals whole epochs only")
    if shuffle == "node":
        local = local_world_size or world_size
        if local < 1 or world_size % local:
            raise ValueError(
                f"node-local shuffle needs the world ({world_size}) to be whole nodes of "
                f"local_world_size={local} ranks"
            )
        nodes, node, local_rank = world_size // local, rank // local, rank % local
        if 0 < n < nodes:
            raise ValueError(f"node-local shuffle needs a sample per node: {n} for {nodes}")
        subset = node_subset(n, seed=seed, node=node, nodes=nodes)
        order = subset[_permutation(len(subset), mix_seed(seed, epoch, node))]
        # Every node the same length: the larger subsets' extra sample (a different one
        # each epoch) is dropped, or the smaller ones repeat one.
        size = -(-n // nodes) if even == "pad" and n % nodes else n // nodes
        order = np.resize(order, size) if len(order) and size != len(order) else order[:size]
        order = _even(order, local, even)
        places = node * (size + local) + np.arange(len(order), dtype=np.int64)
        return order[local_rank::local], places[local_rank::local]
    if shuffle not in (True, False, "global"):
        raise ValueError(f"shuffle must be True, False, 'global' or 'node', not {shuffle!r}")
    if mix is not None:
        order = mixed_order(mix, seed=seed, epoch=epoch, shuffle=bool(shuffle))
    elif shuffle:
        order = _permutation(n, mix_seed(seed, epoch))
    else:
        order = np.arange(n, dtype=np.int64)
    if buckets is not None:
        bucket_of, size = buckets
        rows = bucketed(order, bucket_of, size)[start:end].reshape(-1, size)
        rows = _even(rows, world_size, even)
        at = start + np.arange(rows.size, dtype=np.int64).reshape(-1, size)
        return rows[rank::world_size].reshape(-1), at[rank::world_size].reshape(-1)
    order = order[start:end]
    if world_size > 1:
        order = _even(order, world_size, even)
    places = start + np.arange(len(order), dtype=np.int64)
    return order[rank::world_size], places[rank::world_size]


def bucketed(
    order: npt.NDArray[np.int64], bucket_of: npt.NDArray[np.int64], batch_size: int
) -> npt.NDArray[np.int64]:
    """``order`` regrouped into batches of one bucket each: walking it, each sample joins
    its bucket's pending batch (``bucket_of[sample]``), and a batch goes out, in the place
    its last sample had, when it is full.  What each bucket holds at the end — fewer than a
    batch — is left out of the epoch (the same rule every epoch; the shuffle leaves other
    samples over each time).  Returns the epoch's batches one after another (a multiple of
    ``batch_size`` long).

    A sample marked ``~k`` (negative: an image whose size could not be read, under
    ``on_error="skip"``; see :func:`~asyncloader._dataset._sizes.bucket_index`) is of
    bucket ``k`` and joins it before the rest, as if it stood at the epoch's start, spread
    over the bucket's full batches (the first batches take one more where they do not
    divide evenly): it is read (and counted as skipped) each epoch whenever the bucket
    fills a batch with it, never in what the bucket leaves over, and a batch comes short
    by as few of them as can be.  The samples of known size keep the rule above; a batch
    goes out in the place of its last one (a batch of unknown ones alone, at the start)."""
    if not len(order):
        return order
    b = bucket_of[order]
    known = b >= 0
    b = np.where(known, b, ~b)
    # Positions of the order, bucket by bucket; in each, those of unknown size first.
    by_bucket = np.lexsort((known, b))
    # Where each position stands for a batch's place: the unknown ones at the start.
    stands = np.where(known, np.arange(len(b)), -1)
    starts = np.flatnonzero(np.r_[True, b[by_bucket][1:] != b[by_bucket][:-1]])
    ends = np.r_[starts[1:], len(b)]
    blocks, done = [], []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        pos = by_bucket[lo:hi]
        full = (hi - lo) // batch_size
        unknown = int(np.count_nonzero(~known[pos]))
        u = min(unknown, full * batch_size)  # those in the full batches
        per = u // max(full, 1) + (np.arange(full) < u % max(full, 1))
        theirs = np.arange(batch_size)[None, :] < per[:, None]  # their slots, first
        slots = np.empty((full, batch_size), dtype=np.int64)
        slots[theirs] = pos[:u]
        slots[~theirs] = pos[unknown : unknown + full * batch_size - u]
        blocks.append(order[slots])
        done.append(stands[slots].max(axis=1, initial=-1))
    rows = np.concatenate(blocks)
    return rows[np.argsort(np.concatenate(done), kind="stable")].reshape(-1)


def covered(n: int, world_size: int, even: EvenPolicy) -> int:
    """How many positions of an epoch's order (global shuffle or none) the ranks visit:
    all of them with ``even="pad"`` (the repeats come after), the full rounds with
    ``"drop"``."""
    return n if even == "pad" or world_size <= 1 else n - n % world_size


def consumed_prefix(next_batch: int, batch_size: int, world_size: int, start: int, end: int) -> int:
    """The positions of the epoch's order consumed once every rank of ``world_size`` took
    ``next_batch`` batches of the positions ``[start, end)`` dealt among them: rank ``r``'s
    share is positions ``r, r + world_size, ...``, so together they took a prefix — any one
    rank's count tells it.  Returns the end of that prefix (at most ``end``)."""
    return start + min(next_batch * batch_size * world_size, end - start)


def num_batches(n_samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``n_samples``: the last one may be short unless ``drop_last``."""
    return n_samples // batch_size if drop_last else -(-n_samples // batch_size)


def unshuffled_batch(
    batch: int, batch_size: int, *, rank: int = 0, world_size: int = 1
) -> npt.NDArray[np.int64]:
    """Batch ``batch`` of an unshuffled epoch of ``rank``, before the dataset size is known.

    It is ``epoch_indices(n, shuffle=False, ...)[batch * batch_size:][:batch_size]`` for
    every ``n`` of at least ``(batch + 1) * batch_size * world_size`` samples (``even``
    only changes the last round): a loader that does not shuffle can start while the
    listing is still growing.
    """
    first = batch * batch_size
    return np.arange(first, first + batch_size, dtype=np.int64) * world_size + rank


def run_deal(
    n: int,
    r: RunConfig,
    *,
    epoch: int,
    mix: Mix | None = None,
    buckets: npt.NDArray[np.int64] | None = None,
    span: tuple[int, int] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`epoch_deal` of the run ``r`` (its order, rank and even rule) in ``epoch``: the
    rank's samples and their places; ``buckets``: each sample's bucket (batches of
    ``r.batch_size``), ``span``: the positions of the order to deal."""
    return epoch_deal(
        n,
        seed=r.seed,
        epoch=epoch,
        shuffle=r.shuffle,
        rank=r.rank,
        world_size=r.world_size,
        even=r.shard.even,
        local_world_size=r.shard.local_world_size,
        start=span[0] if span else 0,
        end=span[1] if span else None,
        mix=mix,
        buckets=None if buckets is None else (buckets, r.batch_size),
    )


def samples_per_epoch(
    n: int,
    r: RunConfig,
    mix: Mix | None = None,
    *,
    buckets: npt.NDArray[np.int64] | None = None,
    epoch: int = 0,
) -> int:
    """Samples a rank sees per epoch of ``n`` objects (the same every epoch, but for a
    bucketed run's: ``buckets``, each sample's bucket, leaves over what does not fill a
    batch, which may differ between the epochs of a mix; that of ``epoch`` then)."""
    if buckets is not None:
        return len(run_deal(n, r, epoch=epoch, mix=mix, buckets=buckets)[0])
    if mix is not None:
        return len(_even(np.arange(mix.length), r.world_size, r.shard.even)[r.rank :: r.world_size])
    return len(
        epoch_indices(
            n,
            seed=r.seed,
            epoch=0,
            shuffle="node" if r.shuffle == "node" else False,  # the same count
            rank=r.rank,
            world_size=r.world_size,
            even=r.shard.even,
            local_world_size=r.shard.local_world_size,
        )
    )
