"""Resume states: what a loader saves, and where a loader given one starts.  Pure.

A state (version 2) says where one loader stands — ``epoch``, ``next_batch`` in its rank's
sequence of batches — and, because every rank takes the same number of batches and rank
``r``'s share is positions ``r, r + W, ...`` of the epoch's order, how much of that order
the ranks have consumed together: ``consumed`` of ``[start, end)``.  Any one rank's state
therefore tells every rank of any new layout where to go on.

* The same layout: continue at ``next_batch`` (in that epoch's span, if it had one).
* Another world size or DataLoader worker count: deal ``order[consumed:end]`` among the new
  ranks (``span``), every sample not yet seen once, equal batch counts per rank.
* A state has the same keys whatever it holds (None where it knows nothing: the start of
  an epoch before any batch), as a checkpoint that loads into the state of a new loader
  needs (``torch.distributed.checkpoint`` fills the keys it is given, no others).
* The states of a rank's DataLoader workers (as torchdata's ``StatefulDataLoader`` keeps
  them) merge into that rank's state: a DataLoader takes its workers' batches in turn, so
  the rank has consumed up to the furthest of them (:func:`merge_worker_states`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._base._config import RunConfig
from .._base._filters import describe
from .._dataset._mix import Mix
from ._sampler import consumed_prefix, covered

__all__ = [
    "KEYS",
    "VERSION",
    "Resume",
    "epoch_start",
    "every_key",
    "has_position",
    "loader_state",
    "merge_worker_states",
    "plan_resume",
    "progress",
]

VERSION = 2

# A state saved with other values of these would repeat or skip samples.
_SAME = (
    "filters",
    "buckets",
    "num_objects",
    "mix",
    "seed",
    "shuffle",
    "batch_size",
    "drop_last",
    "even",
)
_LAYOUT = ("world_size", "local_world_size", "num_workers")
# Every key of a state, in the order loader_state gives them.
KEYS = (
    "version",
    "epoch",
    "next_batch",
    "start",
    "end",
    "consumed",
    "num_objects",
    "mix",
    "filters",
    "buckets",
    "seed",
    "shuffle",
    "batch_size",
    "drop_last",
    "rank",
    "world_size",
    "local_world_size",
    "even",
    "worker",
    "num_workers",
)


def every_key(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with every key of a state, in :data:`KEYS` order (None where it has none)."""
    return {key: state.get(key) for key in KEYS}


def epoch_start(epoch: int) -> dict[str, Any]:
    """The state of a run at the start of ``epoch``, before anything of it was delivered:
    every key of a state, None but ``version``, ``epoch`` and ``next_batch`` (0)."""
    return every_key({"version": VERSION, "epoch": epoch, "next_batch": 0})


def has_position(state: Mapping[str, Any]) -> bool:
    """Whether ``state`` holds a position inside an epoch (else it is an epoch's start,
    from :func:`epoch_start`, or from a version that left the other keys out)."""
    return state.get("num_objects") is not None


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a loader goes on: batch ``next_batch`` of ``epoch``; ``span``: that epoch
    deals only positions ``[start, end)`` of its order (the rest of an epoch resumed on
    another layout), None for the whole order."""

    epoch: int
    next_batch: int
    span: tuple[int, int] | None = None


def progress(
    *,
    shuffle: object,
    next_batch: int,
    batch_size: int,
    world_size: int,
    even: str,
    span: tuple[int, int],
    unit: int = 1,
) -> dict[str, int | None]:
    """The ``start``, ``end`` and ``consumed`` of a state (None under node-local shuffle,
    whose nodes keep subsets of their own): ``span`` is the positions the epoch deals,
    ``unit`` what the ranks take whole (a bucketed run's batches: ``batch_size``)."""
    if shuffle == "node":
        return {"start": None, "end": None, "consumed": None}
    start, end = span
    end = start + covered((end - start) // unit, world_size, even) * unit  # type: ignore[arg-type]
    consumed = consumed_prefix(next_batch, batch_size, world_size, start, end)
    return {"start": start, "end": end, "consumed": consumed}


def loader_state(
    run: RunConfig,
    *,
    epoch: int,
    next_batch: int,
    num_objects: int,
    span: tuple[int, int] | None = None,
    mix: Mix | None = None,
    dealt: int | None = None,
) -> dict[str, Any]:
    """The state of a loader of ``run`` over ``num_objects`` objects whose next batch is
    ``next_batch`` of ``epoch`` (that epoch dealing positions ``span`` of its order; None:
    all of them).  ``mix``: the sources' shares of an epoch (its order is ``mix.length``
    long), kept as text (``"sizes 30,10 quotas 20,20"``): another mix is another order; so
    are ``filters`` (their canonical text: another filter is another dataset).

    A bucketed run's order is its epoch regrouped into batches, less what no bucket fills,
    and its ranks take whole batches: ``dealt``, the positions of that order the ranks deal
    in ``epoch`` (each rank's samples times the world size), must be given for it."""
    bucketed = run.buckets is not None
    if span is None and bucketed:
        assert dealt is not None, "a bucketed run's state needs the positions dealt"
        span = (0, dealt)
    where = progress(
        shuffle=run.shuffle,
        next_batch=next_batch,
        batch_size=run.batch_size,
        world_size=run.world_size,
        even=run.shard.even,
        span=span or (0, mix.length if mix is not None else num_objects),
        unit=run.batch_size if bucketed else 1,
    )
    return {
        "version": VERSION,
        "epoch": epoch,
        "next_batch": next_batch,
        **where,
        "num_objects": num_objects,
        "mix": None if mix is None else mix.describe(),
        "filters": describe(run.filters),
        "buckets": _buckets(run),
        "seed": run.seed,
        "shuffle": run.shuffle,
        "batch_size": run.batch_size,
        "drop_last": run.shard.drop_last,
        "rank": run.rank,
        "world_size": run.world_size,
        "local_world_size": run.shard.local_world_size,
        "even": run.shard.even,
        "worker": run.shard.worker,
        "num_workers": run.shard.num_workers,
    }


def _buckets(run: RunConfig) -> str | None:
    """A bucketed run's buckets as its state keeps them: their text, and whether the images
    are bucketed upright (EXIF orientation: another shape for some, another epoch)."""
    if run.buckets is None:
        return None
    return run.buckets.describe() + (" upright" if run.upright else "")


def plan_resume(state: Mapping[str, Any], mine: Mapping[str, Any]) -> Resume:
    """Where a loader whose own state is ``mine`` goes on from the saved ``state``.

    Raises:
        ValueError: the state belongs to a different dataset, seed, order or batch size
            (resuming would repeat or skip samples); to another layout with a node-local
            shuffle or several DataLoader workers (merge those first); or to a version
            without elastic resume on another layout.
    """
    if not has_position(state):  # an epoch's start: nothing of it was delivered yet
        return Resume(int(state["epoch"]), 0)
    for name in _SAME:
        if state.get(name) != mine[name]:
            raise ValueError(
                f"cannot resume: the state was saved with {name}={state.get(name)!r}, "
                f"this loader has {name}={mine[name]!r} (a different dataset, seed, "
                "batch size or order would repeat or skip samples)"
            )
    epoch, next_batch = int(state["epoch"]), int(state["next_batch"])
    if all(state.get(k) == mine[k] for k in _LAYOUT) and (
        mine["num_workers"] == 1 or state.get("worker") == mine["worker"]
    ):
        # The same layout (any rank's state serves every rank: they move in step).
        span = (int(state["start"]), int(state["end"])) if state.get("start") else None
        return Resume(epoch, next_batch, span)
    what = ", ".join(f"{k}={state.get(k)!r} (now {mine[k]!r})" for k in _LAYOUT)
    if state.get("shuffle") == "node":
        raise ValueError(
            f"cannot resume: saved with {what}; a node-local shuffle resumes on the "
            "same ranks and nodes only (each node's subset depends on them)"
        )
    if state.get("num_workers", 1) > 1:
        raise ValueError(
            f"cannot resume: saved with {what}; the state of one of several DataLoader "
            "workers holds only that worker's position: resume it on the same worker "
            "count, or merge the states of all of the rank's workers "
            "(asyncloader.merge_worker_states; ImageDataset.load_state_dict does it for a "
            "StatefulDataLoader's state)"
        )
    if state.get("consumed") is None:
        raise ValueError(f"cannot resume: saved with {what} by a version without elastic resume")
    # Elastic: the rest of the epoch's order is dealt among this layout's ranks.  A state
    # taken as the epoch's last batch came (its loader had not seen the end) has none left:
    # the epoch goes on with nothing, as on its own layout, and the next is set as ever.
    consumed, end = int(state["consumed"]), int(state["end"])
    return Resume(epoch, 0, (min(consumed, end), end))


def merge_worker_states(
    states: Sequence[Mapping[str, Any]], *, later_batches: int = 0
) -> dict[str, Any]:
    """One rank's state from the states of all of its DataLoader workers' loaders.

    A DataLoader takes one batch from each worker in turn, so when it stops, the rank has
    consumed every batch before the furthest one any of its workers delivered in the
    earliest epoch still running (a worker that finished the epoch is in the next one,
    at batch 0).  The result is the state of a rank served by one loader (``worker`` 0 of
    ``num_workers`` 1): it resumes on any world size and worker count.

    A worker that has not delivered anything yet may give a state without a position
    (:func:`epoch_start`): it counts as batch 0 of its epoch.
    ``later_batches``: batches the DataLoader delivered after the states were taken (a
    ``StatefulDataLoader`` that snapshots its workers every n steps says how many).

    Raises:
        ValueError: no state with a position, states of different runs or ranks, or not
            one state per worker.
    """
    full = [s for s in states if has_position(s)]
    if not full:
        raise ValueError("no worker state with a position (nothing was delivered yet?)")
    first = full[0]
    for s in full[1:]:
        for name in (*_SAME, *_LAYOUT, "rank", "version"):
            if s.get(name) != first.get(name):
                raise ValueError(
                    f"cannot merge worker states with different {name}: "
                    f"{s.get(name)!r} and {first.get(name)!r}"
                )
    workers = int(first.get("num_workers", 1))
    seen = sorted(int(s.get("worker", 0)) for s in full)
    if len(states) != workers or len(set(seen)) != len(seen):
        raise ValueError(
            f"cannot merge: {len(states)} worker state(s) for num_workers={workers} "
            f"(workers {seen}); pass the state of each of the rank's workers once"
        )
    # A worker that finished the epoch is at batch 0 of the next one; the others are in
    # the earliest epoch, and the DataLoader has taken every batch before the furthest.
    epoch = min(int(s["epoch"]) for s in full)
    furthest = max(
        (s for s in full if int(s["epoch"]) == epoch), key=lambda s: int(s["next_batch"])
    )
    merged = {**furthest, "worker": 0, "num_workers": 1}
    if later_batches:
        merged["next_batch"] = next_batch = int(merged["next_batch"]) + later_batches
        if merged.get("consumed") is not None:  # not under node-local shuffle
            merged.update(
                progress(
                    shuffle=merged["shuffle"],
                    next_batch=next_batch,
                    batch_size=int(merged["batch_size"]),
                    world_size=int(merged["world_size"]),
                    even=str(merged["even"]),
                    span=(int(merged["start"]), int(merged["end"])),  # evened already
                )
            )
    return merged
