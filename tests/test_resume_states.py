"""Resume states without a store: a rank's DataLoader workers' states merge into the rank's
state, and that state deals the rest of the epoch exactly once on any new layout."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._base._config import RunConfig, ShardConfig
from asyncloader._run._resume import epoch_start, loader_state, plan_resume
from asyncloader._run._sampler import covered, epoch_indices, num_batches


def _run(world: int, workers: int, worker: int = 0, rank: int = 0, **kw: Any) -> RunConfig:
    kw.setdefault("batch_size", 4)
    kw.setdefault("seed", 5)
    layout = {k: kw.pop(k) for k in ("even", "drop_last", "local_world_size") if k in kw}
    shard = ShardConfig(worker=worker, num_workers=workers, **layout)
    return RunConfig(rank=rank, world_size=world, shard=shard, **kw)


def _worker_states(
    n: int, world: int, workers: int, delivered: int, epoch: int = 3, **kw: Any
) -> list[dict[str, Any]]:
    """Rank 0's workers' states after its DataLoader delivered ``delivered`` batches: each
    worker's state as of the last batch it delivered (batch ``b`` comes from worker
    ``b % workers``), or the state it started with (no position) if it delivered none."""
    states: list[dict[str, Any]] = []
    for w in range(workers):
        mine = [b for b in range(delivered) if b % workers == w]
        if not mine:
            states.append({"epoch": epoch, "next_batch": 0})
        else:
            run = _run(world, workers, w, **kw)
            states.append(loader_state(run, epoch=epoch, next_batch=mine[-1] + 1, num_objects=n))
    return states


def _deal(state: dict[str, Any], n: int, world: int, workers: int, **kw: Any) -> list[int]:
    """Every sample the ranks and workers of a new layout deliver resuming from ``state``,
    for the rest of its epoch (the positions the sampler deals them)."""
    out: list[int] = []
    for rank in range(world):
        for w in range(workers):
            run = _run(world, workers, w, rank=rank, **kw)
            mine = loader_state(run, epoch=0, next_batch=0, num_objects=n)
            plan = plan_resume(state, mine)
            assert plan.epoch == state["epoch"]  # its rest, however little is left
            order = epoch_indices(
                n,
                seed=run.seed,
                epoch=plan.epoch,
                shuffle=run.shuffle,
                rank=rank,
                world_size=world,
                even=run.shard.even,
                **({"start": plan.span[0], "end": plan.span[1]} if plan.span else {}),
            )
            nb = num_batches(len(order), run.batch_size, run.shard.drop_last)
            for b in range(plan.next_batch, nb):
                if b % workers == w:
                    out += order[b * run.batch_size : (b + 1) * run.batch_size].tolist()
    return out


LAYOUTS = {
    "n": st.integers(8, 300),  # samples
    "world": st.integers(1, 4),  # ranks that saved the state
    "new_world": st.integers(1, 4),  # ranks and workers that resume from it
    "new_workers": st.integers(1, 4),
    "frac": st.floats(0, 1),  # how far into the epoch
    "even": st.sampled_from(["pad", "drop"]),
}


@settings(max_examples=300)
@given(workers=st.integers(1, 4), **LAYOUTS)
def test_merged_worker_states_resume_the_rest_exactly_once(
    n: int, world: int, workers: int, new_world: int, new_workers: int, frac: float, even: str
) -> None:
    kw = {"even": even}
    per_rank = len(epoch_indices(n, seed=5, epoch=3, shuffle=True, world_size=world, even=even))
    nb = num_batches(per_rank, 4, False)
    delivered = min(nb, int(frac * nb))
    states = _worker_states(n, world, workers, delivered, **kw)
    if delivered == 0:
        with pytest.raises(ValueError, match="no worker state"):
            al.merge_worker_states(states)
        return
    merged = al.merge_worker_states(states)
    end = covered(n, world, even)  # type: ignore[arg-type]
    assert merged["next_batch"] == delivered
    assert merged["consumed"] == min(delivered * 4 * world, end)
    assert (merged["worker"], merged["num_workers"]) == (0, 1)
    # What the old layout consumed (every rank took `delivered` batches) ...
    order = epoch_indices(n, seed=5, epoch=3, shuffle=True)[:end].tolist()
    consumed = order[: merged["consumed"]]
    # ... and what the new layout delivers: together, each sample of the epoch once, every
    # new rank the same count — with "pad", plus the repeats that even out a last round
    # (the new layout's, or the old one's when the layout is the same: its epoch goes on).
    rest = _deal(merged, n, new_world, new_workers, **kw)
    left = order[merged["consumed"] :]
    if even == "pad":
        assert set(left) <= set(rest)
        assert len(rest) - len(left) < max(new_world, world)
    else:  # the new layout's incomplete last round is left out, as in any even world
        assert set(rest) <= set(left)
        assert len(rest) == len(set(rest)) == len(left) - len(left) % new_world
        assert not set(rest) & set(consumed)


def test_a_finished_epoch_merges_to_the_next() -> None:
    # Each worker ran out of epoch 3 and stands at batch 0 of epoch 4.
    states = [loader_state(_run(2, 3, w), epoch=4, next_batch=0, num_objects=50) for w in range(3)]
    merged = al.merge_worker_states(states)
    assert (merged["epoch"], merged["next_batch"], merged["consumed"]) == (4, 0, 0)


@settings(max_examples=200)
@given(**LAYOUTS)
def test_a_state_at_the_epoch_s_end_goes_on_with_nothing_left_on_any_layout(
    n: int, world: int, new_world: int, new_workers: int, frac: float, even: str
) -> None:
    """A rank's state taken as its epoch's last batch came (its loader had not seen the
    end yet) goes on in that epoch with nothing left, on its own layout and on every
    other: the same epoch either way (never the next on one layout and the empty rest
    of the old one on another), so a loop from the state's epoch or the loader's runs no
    epoch twice.  A state inside the epoch deals the rest."""
    run = _run(world, 1, even=even)
    per_rank = len(epoch_indices(n, seed=5, epoch=3, shuffle=True, world_size=world, even=even))
    nb = num_batches(per_rank, 4, False)
    at = min(nb, int(frac * (nb + 1)))
    state = loader_state(run, epoch=3, next_batch=at, num_objects=n)
    for layout in (run, _run(new_world, new_workers, even=even)):
        plan = plan_resume(state, loader_state(layout, epoch=0, next_batch=0, num_objects=n))
        assert plan.epoch == 3
    rest = _deal(state, n, new_world, new_workers, even=even)
    assert (rest == []) == (at == nb)


def test_later_batches_count_past_the_snapshot() -> None:
    states = _worker_states(100, 2, 2, 3)
    merged = al.merge_worker_states(states, later_batches=2)
    assert merged["next_batch"] == 5
    assert merged["consumed"] == 5 * 4 * 2


def test_merging_refuses_states_that_are_not_one_ranks_workers() -> None:
    states = _worker_states(100, 2, 2, 4)
    with pytest.raises(ValueError, match="worker state"):
        al.merge_worker_states(states[:1])  # one of two workers
    with pytest.raises(ValueError, match="worker state"):
        al.merge_worker_states([states[0], states[0]])
    other = {**states[1], "seed": 6}
    with pytest.raises(ValueError, match="seed"):
        al.merge_worker_states([states[0], other])
    rank1 = {**states[1], "rank": 1}
    with pytest.raises(ValueError, match="rank"):
        al.merge_worker_states([states[0], rank1])


def test_one_of_several_workers_states_alone_is_refused_with_the_way_out() -> None:
    state = _worker_states(100, 2, 2, 4)[0]
    mine = loader_state(_run(3, 1), epoch=0, next_batch=0, num_objects=100)
    with pytest.raises(ValueError, match="merge_worker_states"):
        plan_resume(state, mine)


def test_rank_state_reads_a_stateful_dataloader_state() -> None:
    from asyncloader.torch import rank_state

    states = _worker_states(100, 2, 2, 3)
    sdl = {
        "_snapshot": {
            "_snapshot_step": 3,
            "_last_yielded_worker_id": 0,
            "_main_snapshot": {},
            "_worker_snapshots": {
                f"worker_{i}": {"worker_id": i, "dataset_state": s, "fetcher_state": None}
                for i, s in enumerate(states)
            },
        },
        "_steps_since_snapshot": 0,
        "_iterator_finished": False,
    }
    assert rank_state(sdl) == al.merge_worker_states(states)
    sdl["_steps_since_snapshot"] = 1
    assert rank_state(sdl)["next_batch"] == 4
    # Nothing delivered yet: the epoch, from its start.
    fresh = _worker_states(100, 2, 2, 0, epoch=7)
    for i, s in enumerate(fresh):
        sdl["_snapshot"]["_worker_snapshots"][f"worker_{i}"]["dataset_state"] = s
    assert rank_state(sdl) == epoch_start(7)
    # num_workers=0: the dataset's own state.
    single = {"_num_yielded": 3, "_dataset_state": states[0], "_fetcher_state": None}
    assert rank_state(single) == states[0]
    assert rank_state(states[1]) is states[1]


def test_a_loaded_state_reaches_each_worker_once_whenever_it_started() -> None:
    """A state the training process loads reaches every DataLoader worker of the next
    iteration once: those started after the load (their copy of the dataset holds it: a
    shallow copy here, sharing the shared memory as a forked worker does) and those running
    since before it (``persistent_workers``: through shared memory).  A later iteration's
    workers, forked again from the training process's copy, do not take it again; the
    training process forgets it once a worker has delivered a batch after taking it."""
    import copy

    from asyncloader._base._worker_resume import WorkerResume

    state = {"epoch": 2, "next_batch": 5, "filters": "size >= 3"}
    trainer = WorkerResume()
    trainer.load(state)
    assert trainer.pending() == state
    fresh = [copy.copy(trainer) for _ in range(2)]  # the next iteration's two workers
    assert fresh[1].take(1) == state and fresh[0].take(0) == state  # in any order
    assert trainer.pending() == state  # taken, nothing delivered yet
    fresh[0].delivered()
    assert trainer.pending() is None
    later = copy.copy(trainer)  # the iteration after: the state stays where it was used
    assert later.take(0) is None and later.take(1) is None

    trainer = WorkerResume()
    running = [copy.copy(trainer) for _ in range(2)]  # started before any load
    assert running[0].take(0) is None and trainer.pending() is None
    trainer.load(state)
    assert running[0].take(0) == state and running[1].take(1) == state
    assert trainer.pending() == state
    running[1].delivered()
    assert trainer.pending() is None
    assert running[0].take(0) is None and running[1].take(1) is None  # not again
    trainer.load(None)  # an epoch's start: no position to take
    assert running[0].take(0) is None and trainer.pending() is None
    assert WorkerResume().take(None) is None
    worker = copy.copy(trainer)  # torchdata's StatefulDataLoader: a worker's own state
    worker.load(state, worker=True)
    running[0].delivered()
    assert worker.pending() == state and trainer.pending() is None
    assert worker.take(0) == state and worker.take(0) is None

    trainer = WorkerResume()  # a state loaded here, and workers given their own besides
    trainer.load(state)
    own = copy.copy(trainer)
    own.load({"epoch": 2, "next_batch": 7}, worker=True)
    assert own.take(0) == {"epoch": 2, "next_batch": 7}
    own.delivered()
    assert copy.copy(trainer).take(0) is None  # the next iteration's new worker 0
    assert trainer.take(None) is None  # nor the training process, iterating it itself


def test_a_state_too_large_for_shared_memory_is_refused_only_where_it_must_travel() -> None:
    import copy

    from asyncloader._base._worker_resume import WorkerResume

    trainer = WorkerResume()
    persistent = copy.copy(trainer)
    big = {"epoch": 0, "filters": "x" * WorkerResume.BOX}
    trainer.load(big)
    assert copy.copy(trainer).take(0) == big  # a worker started after the load has it
    with pytest.raises(ValueError, match="persistent_workers"):
        persistent.take(0)
    with pytest.raises(ValueError, match="1024 workers"):
        copy.copy(trainer).take(WorkerResume.WORKERS)
    assert trainer.take(None) == big and trainer.take(None) is None  # in-process: once
