"""Several sources mixed by weight (pure): quotas, each source's draws without replacement
across epochs, the share of every window, exactly once where the weights are the sizes,
and elastic resume of a mixed epoch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._dataset._mix import Mix, quotas
from asyncloader._run._sampler import (
    MIX_BLOCK,
    consumed_prefix,
    covered,
    epoch_indices,
    mixed_order,
)

seeds = st.integers(min_value=0, max_value=2**63)
source_sizes = st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=4)


def _mix(sizes: list[int], weights: list[float] | None, length: int | None = None) -> Mix:
    return Mix(
        tuple(f"s{i}" for i in range(len(sizes))), tuple(sizes), quotas(sizes, weights, length)
    )


@given(
    sizes=source_sizes,
    weights=st.lists(st.floats(0.01, 100), min_size=4, max_size=4),
    length=st.integers(1, 2000) | st.none(),
)
def test_quotas_add_up_and_follow_the_weights(
    sizes: list[int], weights: list[float], length: int | None
) -> None:
    w = weights[: len(sizes)]
    q = quotas(sizes, w, length)
    total = sum(sizes) if length is None else length
    assert sum(q) == total
    for qs, ws in zip(q, w, strict=True):
        assert abs(qs - total * ws / sum(w)) < 1
    assert quotas(sizes, None, None) == tuple(sizes)  # no weights: each its size


def test_quotas_refuse_what_cannot_be() -> None:
    with pytest.raises(ValueError, match="not all 0"):
        quotas([3, 4], [0, 0], None)
    with pytest.raises(ValueError, match=">= 0"):
        quotas([3, 4], [1, -1], None)
    with pytest.raises(ValueError, match="at least 1"):
        quotas([3, 4], None, 0)


@given(sizes=source_sizes, seed=seeds, epoch=st.integers(0, 1000), shuffle=st.booleans())
def test_weights_that_are_the_sizes_give_every_sample_once(
    sizes: list[int], seed: int, epoch: int, shuffle: bool
) -> None:
    mix = _mix(sizes, None)
    order = mixed_order(mix, seed=seed, epoch=epoch, shuffle=shuffle)
    assert sorted(order.tolist()) == list(range(sum(sizes)))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 200), min_size=2, max_size=3),
    weights=st.lists(st.floats(0.1, 10), min_size=3, max_size=3),
    seed=seeds,
    shuffle=st.booleans(),
)
def test_each_source_draws_without_replacement_across_epochs(
    sizes: list[int], weights: list[float], seed: int, shuffle: bool
) -> None:
    """Source s's draws, epoch after epoch, are its permutations one after the other:
    within any run of its size no sample twice, and every sample in every such run."""
    mix = _mix(sizes, weights[: len(sizes)])
    draws: dict[int, list[int]] = {s: [] for s in range(len(sizes))}
    epochs = max(-(-3 * n // max(q, 1)) for n, q in zip(sizes, mix.quotas, strict=True))
    for epoch in range(min(epochs, 40)):
        order = mixed_order(mix, seed=seed, epoch=epoch, shuffle=shuffle)
        src = mix.source_of(order)
        assert Counter(src.tolist()) == {s: q for s, q in enumerate(mix.quotas) if q}
        for s in range(len(sizes)):
            draws[s] += (order[src == s] - mix.offsets[s]).tolist()
    for s, n in enumerate(sizes):
        got = draws[s]
        for cycle in range(len(got) // n):
            assert sorted(got[cycle * n : (cycle + 1) * n]) == list(range(n))
        if not shuffle:
            assert got == [i % n for i in range(len(got))]


@pytest.mark.parametrize("weights", [(1, 1), (3, 1), (1, 3), (5, 3, 2)])
def test_every_window_holds_the_shares(weights: tuple[int, ...]) -> None:
    """One rank: each source's share of any 10 batches of 16 is within 3 % of its weight
    (the places are exact to a sample; the shuffle within blocks of 8 adds at most a block's
    worth at the ends), for 20 seeds and epochs, sources of very different sizes."""
    sizes = [5000, 700, 2000][: len(weights)]
    mix = _mix(sizes, list(weights), 6000)
    window = 10 * 16
    assert 2 * MIX_BLOCK / window <= 0.1
    for seed in range(20):
        order = mixed_order(mix, seed=seed, epoch=seed, shuffle=True)
        src = mix.source_of(order)
        for s, w in enumerate(weights):
            share = np.convolve(src == s, np.ones(window), "valid") / window
            assert np.abs(share - w / sum(weights)).max() <= 0.03, (seed, s)


def test_ranks_of_a_world_get_the_shares() -> None:
    """Ranks take positions r, r + W, …: over an epoch each rank's share is the weight's
    to within a few percent, whatever W (the blocks' shuffle breaks up the places' period:
    a rank's share varies as a random sample's, here σ ≤ 0.6 %)."""
    sizes, weights = [30000, 10000], [3, 1]
    mix = _mix(sizes, weights, 40000)
    for world in (2, 3, 4, 8):
        for rank in range(world):
            idx = epoch_indices(
                40000, seed=1, epoch=0, shuffle=True, rank=rank, world_size=world, mix=mix
            )
            share = float(np.mean(mix.source_of(idx) == 0))
            assert abs(share - 0.75) < 0.03, (world, rank, share)


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 150), min_size=2, max_size=3),
    seed=seeds,
    old=st.integers(1, 5),
    new=st.integers(1, 5),
    batch=st.integers(1, 16),
    k=st.integers(0, 30),
    even=st.sampled_from(["pad", "drop"]),
)
def test_elastic_resume_of_a_mixed_epoch_deals_exactly_the_rest(
    sizes: list[int], seed: int, old: int, new: int, batch: int, k: int, even: str
) -> None:
    """The mixed order does not depend on the world size: what ``old`` ranks consumed is a
    prefix of it, and the rest dealt to ``new`` ranks is every other position once."""
    mix = _mix(sizes, [2.0, 1.0, 0.5][: len(sizes)], 3 * sum(sizes) // 2)
    n, length = sum(sizes), mix.length
    kw = {"seed": seed, "epoch": 2, "shuffle": True, "even": even, "mix": mix}
    per_rank = [epoch_indices(n, rank=r, world_size=old, **kw) for r in range(old)]  # type: ignore[arg-type]
    order = epoch_indices(n, **kw)  # type: ignore[arg-type]
    end = covered(length, old, even)  # type: ignore[arg-type]
    consumed = consumed_prefix(k, batch, old, 0, end)
    seen = Counter(x for r in per_rank for x in r[: k * batch].tolist())
    if even == "drop" or consumed < length:
        assert seen == Counter(order[:consumed].tolist())
    rest = [
        epoch_indices(n, rank=r, world_size=new, start=consumed, end=end, **kw)  # type: ignore[arg-type]
        for r in range(new)
    ]
    assert len({len(r) for r in rest}) == 1
    dealt = Counter(x for r in rest for x in r.tolist())
    left = Counter(order[consumed:end].tolist())
    if even == "pad":
        assert set(dealt) == set(left) and sum(dealt.values()) - sum(left.values()) < new
    else:
        assert sum(dealt.values()) == sum(left.values()) - sum(left.values()) % new
        assert not dealt - left


def test_a_url_given_twice_counts_as_one_source() -> None:
    mix = Mix(("s3://a/", "s3://a/", "s3://b/"), (4, 4, 2), (4, 4, 2))
    assert mix.count([0, 1, 4, 5, 8]) == {"s3://a/": 4, "s3://b/": 1}
