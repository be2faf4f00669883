"""Property tests of the pure sampler."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._dataset._mix import Mix, quotas
from asyncloader._run._sampler import (
    consumed_prefix,
    covered,
    epoch_deal,
    epoch_indices,
    mix_seed,
    node_subset,
    num_batches,
    sample_seeds,
    unshuffled_batch,
)

sizes = st.integers(min_value=0, max_value=3000)
seeds = st.integers(min_value=0, max_value=2**63)
epochs = st.integers(min_value=0, max_value=10_000)


@given(n=sizes, seed=seeds, epoch=epochs, shuffle=st.booleans())
def test_one_rank_is_a_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> None:
    order = epoch_indices(n, seed=seed, epoch=epoch, shuffle=shuffle)
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(order, epoch_indices(n, seed=seed, epoch=epoch, shuffle=shuffle))


@given(n=st.integers(min_value=50, max_value=3000), seed=seeds)
def test_epochs_differ(n: int, seed: int) -> None:
    a = epoch_indices(n, seed=seed, epoch=0, shuffle=True)
    b = epoch_indices(n, seed=seed, epoch=1, shuffle=True)
    assert not np.array_equal(a, b)


@settings(max_examples=200)
@given(
    n=sizes,
    world=st.integers(min_value=1, max_value=16),
    seed=seeds,
    epoch=epochs,
    even=st.sampled_from(["pad", "drop"]),
)
def test_ranks_cover_disjointly_with_equal_counts(
    n: int, world: int, seed: int, epoch: int, even: str
) -> None:
    shards = [
        epoch_indices(n, seed=seed, epoch=epoch, shuffle=True, rank=r, world_size=world, even=even)  # type: ignore[arg-type]
        for r in range(world)
    ]
    counts = {len(s) for s in shards}
    assert len(counts) == 1  # equal per rank: no DDP hang
    seen = np.concatenate(shards) if shards else np.array([])
    if even == "drop":
        assert len(seen) == len(set(seen.tolist())) == n - n % world
    else:
        assert set(seen.tolist()) == set(range(n))
        assert len(seen) == n + (-n % world if n else 0)
        # Padding repeats the order from its start, cyclically.
        order = epoch_indices(n, seed=seed, epoch=epoch, shuffle=True)
        if n:
            assert sorted(seen.tolist()) == sorted(np.resize(order, len(seen)).tolist())


@given(n=st.integers(min_value=0, max_value=10_000), b=st.integers(min_value=1, max_value=512))
def test_num_batches(n: int, b: int) -> None:
    assert num_batches(n, b, True) * b <= n
    assert num_batches(n, b, False) * b >= n
    assert (num_batches(n, b, False) - 1) * b < n or n == 0


@given(
    a=st.integers(min_value=0, max_value=2**64 - 1), b=st.integers(min_value=0, max_value=2**64 - 1)
)
def test_mix_seed_is_order_sensitive(a: int, b: int) -> None:
    if a != b:
        assert mix_seed(a, b) != mix_seed(b, a)
    assert 0 <= mix_seed(a, b) < 2**64


@settings(max_examples=200)
@given(
    n=sizes,
    nodes=st.integers(min_value=1, max_value=4),
    local=st.integers(min_value=1, max_value=4),
    seed=seeds,
    epoch=st.integers(min_value=0, max_value=50),
    even=st.sampled_from(["pad", "drop"]),
)
def test_node_local_shuffle(
    n: int, nodes: int, local: int, seed: int, epoch: int, even: str
) -> None:
    world = nodes * local
    if 0 < n < nodes:
        return  # refused: a node without samples
    kw = dict(seed=seed, shuffle="node", world_size=world, local_world_size=local, even=even)

    def shards(e: int) -> list[np.ndarray]:
        return [epoch_indices(n, epoch=e, rank=r, **kw) for r in range(world)]  # type: ignore[arg-type]

    now, later = shards(epoch), shards(epoch + 1)
    assert len({len(s) for s in now}) == 1  # equal per rank: no DDP hang
    seen = np.concatenate(now).tolist()
    if even == "drop":
        assert len(seen) == len(set(seen))  # nothing twice
        assert len(seen) > n - nodes - world  # at most the incomplete rounds left out
    else:
        assert set(seen) == set(range(n))  # everything at least once
        assert len(seen) < n + nodes + world
    for node in range(nodes):
        subset = set(node_subset(n, seed=seed, node=node, nodes=nodes).tolist())
        ranks = range(node * local, (node + 1) * local)
        for e in (now, later):
            assert {x for r in ranks for x in e[r].tolist()} <= subset  # stable per node
    assert all(np.array_equal(a, b) for a, b in zip(now, shards(epoch), strict=True))


@given(
    n=st.integers(min_value=8, max_value=3000),
    nodes=st.integers(min_value=1, max_value=8),
    seed=seeds,
)
def test_node_subsets_partition_the_dataset(n: int, nodes: int, seed: int) -> None:
    parts = [node_subset(n, seed=seed, node=i, nodes=nodes).tolist() for i in range(nodes)]
    assert sorted(x for p in parts for x in p) == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_node_local_refuses_partial_nodes() -> None:
    import pytest

    with pytest.raises(ValueError, match="whole nodes"):
        epoch_indices(10, seed=0, epoch=0, shuffle="node", rank=0, world_size=3, local_world_size=2)
    with pytest.raises(ValueError, match="shuffle must be"):
        epoch_indices(10, seed=0, epoch=0, shuffle="local")  # type: ignore[arg-type]


@settings(max_examples=300)
@given(
    batch=st.integers(0, 20),
    batch_size=st.integers(1, 50),
    world=st.integers(1, 8),
    extra=st.integers(0, 500),
    rank_seed=st.integers(0, 7),
    even=st.sampled_from(["pad", "drop"]),
)
def test_an_unshuffled_batch_is_known_before_the_dataset_size(
    batch: int, batch_size: int, world: int, extra: int, rank_seed: int, even: str
) -> None:
    rank = rank_seed % world
    n = (batch + 1) * batch_size * world + extra  # any size at least that
    whole = epoch_indices(
        n,
        seed=1,
        epoch=3,
        shuffle=False,
        rank=rank,
        world_size=world,
        even=even,  # type: ignore[arg-type]
    )
    early = unshuffled_batch(batch, batch_size, rank=rank, world_size=world)
    assert np.array_equal(early, whole[batch * batch_size : (batch + 1) * batch_size])


@given(
    n=st.integers(min_value=1, max_value=400),
    seed=seeds,
    old=st.integers(min_value=1, max_value=8),
    new=st.integers(min_value=1, max_value=8),
    batch=st.integers(min_value=1, max_value=32),
    k=st.integers(min_value=0, max_value=60),
    even=st.sampled_from(["pad", "drop"]),
)
def test_elastic_resume_deals_exactly_the_rest(
    n: int, seed: int, old: int, new: int, batch: int, k: int, even: str
) -> None:
    """After every one of ``old`` ranks took ``k`` batches, the positions they consumed
    are a prefix of the epoch's order, and dealing the rest to ``new`` ranks gives each
    sample not yet seen once (plus repeats that even out the last round, with "pad"), and
    every new rank the same count."""
    kw = {"seed": seed, "epoch": 3, "shuffle": True, "even": even}
    per_rank = [epoch_indices(n, rank=r, world_size=old, **kw) for r in range(old)]  # type: ignore[arg-type]
    seen = [x for r in per_rank for x in r[: k * batch].tolist()]
    end = covered(n, old, even)  # type: ignore[arg-type]
    consumed = consumed_prefix(k, batch, old, 0, end)
    order = epoch_indices(n, **kw)  # type: ignore[arg-type]
    assert set(seen) == set(order[:consumed].tolist())  # (seen may hold "pad" repeats)
    rest = [
        epoch_indices(n, rank=r, world_size=new, start=consumed, end=end, **kw)  # type: ignore[arg-type]
        for r in range(new)
    ]
    assert len({len(r) for r in rest}) == 1
    dealt = [x for r in rest for x in r.tolist()]
    left = order[consumed:end].tolist()
    if even == "pad":
        assert set(dealt) == set(left) and len(dealt) - len(left) < new
    else:
        assert len(dealt) == len(set(dealt)) == len(left) - len(left) % new


# --- places: what each sample's seed is made from -----------------------------------------


def _full_order(n: int, kw: dict[str, object]) -> np.ndarray:
    """The epoch's order as one rank deals it (regrouped into batches, bucketed)."""
    return epoch_deal(n, **kw)[0]  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=300),
    seed=seeds,
    world=st.integers(min_value=1, max_value=8),
    new=st.integers(min_value=1, max_value=8),
    taken=st.integers(min_value=0, max_value=20),
    even=st.sampled_from(["pad", "drop"]),
    shuffle=st.booleans(),
    batch=st.integers(min_value=1, max_value=8),
    bucketing=st.integers(min_value=0, max_value=3),
)
def test_a_place_is_the_sample_s_position_in_the_epoch_s_order(
    n: int,
    seed: int,
    world: int,
    new: int,
    taken: int,
    even: str,
    shuffle: bool,
    batch: int,
    bucketing: int,
) -> None:
    """Every rank's samples stand at their places in the one-rank order; no two dealt
    samples share a place (padding takes places after the order's end); the places of the
    rest of an epoch dealt to ``new`` ranks after a resume are the uninterrupted run's."""
    kw: dict[str, object] = {"seed": seed, "epoch": 2, "shuffle": shuffle, "even": even}
    if bucketing:  # 1 to 3 buckets, the samples spread by their index
        kw["buckets"] = (np.arange(n, dtype=np.int64) % bucketing, batch)
    order = _full_order(n, kw)
    assert np.array_equal(epoch_deal(n, **kw)[1], np.arange(len(order)))  # type: ignore[arg-type]

    def check(start: int, end: int | None, ranks: int) -> list[int]:
        places: list[int] = []
        for r in range(ranks):
            where: dict[str, object] = {"rank": r, "world_size": ranks, "start": start, "end": end}
            got, at = epoch_deal(n, **where, **kw)  # type: ignore[arg-type]
            assert np.array_equal(got, epoch_indices(n, **where, **kw))  # type: ignore[arg-type]
            assert len(got) == len(at)
            inside = at < len(order)
            assert np.array_equal(order[at[inside]], got[inside])
            assert (at >= start).all()
            places += at.tolist()
        assert len(places) == len(set(places))
        return places

    whole = check(0, None, world)
    if even == "pad":  # every place of the order is dealt
        assert set(range(len(order))) <= set(whole)
    # The rest after every rank took `taken` batches (of one sample, unbucketed): its
    # places are the uninterrupted run's.
    unit = batch if bucketing else 1
    end = covered(len(order) // unit, world, even) * unit  # type: ignore[arg-type]
    start = consumed_prefix(taken, unit, world, 0, end)
    rest = check(start, end, new)
    assert {p for p in whole if start <= p < len(order)} >= {p for p in rest if p < len(order)}


@given(sizes=st.lists(st.integers(1, 20), min_size=1, max_size=3), seed=seeds)
def test_a_sample_drawn_twice_in_an_epoch_gets_two_seeds(sizes: list[int], seed: int) -> None:
    """A mix that draws a source more often than it has samples repeats them; each draw has
    its own place, so a transform drawing from its seed gets another crop each time."""
    mix = Mix(tuple(f"s{i}" for i in range(len(sizes))), tuple(sizes), quotas(sizes, None, 97))
    got, places = epoch_deal(sum(sizes), seed=seed, epoch=1, shuffle=True, mix=mix)
    assert len(got) == 97 and len(set(got.tolist())) < 97  # repeats
    seeds_ = sample_seeds(seed, 1, places)
    assert len(set(seeds_)) == 97
    assert seeds_ == sample_seeds(seed, 1, places) != sample_seeds(seed, 2, places)
