"""A resume state loaded in the training process, on its way to the DataLoader workers that
iterate the dataset: those started after the load (their copy of the dataset holds it) and
those already running (``persistent_workers=True``: their copy was made before, so the
state travels in shared memory, read as their next epoch starts).

Each worker takes a state once, at the first iteration that starts after it was loaded; a
later iteration (a new process forked from the training process's dataset, which still
holds it, or a persistent worker) does not take it again.  The training process forgets it
once a worker has delivered a batch after taking it: its ``state_dict()`` then describes
the workers' epoch, not the loaded one.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["WorkerResume"]


class WorkerResume:
    """The training process's loaded resume state and the workers' view of it.

    Shared memory (travels to forked and spawned workers alike): ``gens`` — the generation
    of the last state loaded (1, 2, ...; 0: none) and the latest generation under which a
    worker delivered a batch; ``taken`` — per DataLoader worker (the first ``WORKERS``), the
    generation it last took; ``box`` — the last state loaded, pickled, its length first
    (``-1``: larger than the box; a running worker then cannot take it, and says so).
    """

    WORKERS = 1024
    BOX = 256 * 1024

    def __init__(self) -> None:
        import torch

        gens = torch.zeros(2, dtype=torch.int64)
        self.gens: Any = gens.share_memory_()  # type: ignore[no-untyped-call]
        taken = torch.zeros(self.WORKERS, dtype=torch.int64)
        self.taken: Any = taken.share_memory_()  # type: ignore[no-untyped-call]
        box = torch.zeros(self.BOX, dtype=torch.uint8)
        self.box: Any = box.share_memory_()  # type: ignore[no-untyped-call]
        self.state: dict[str, Any] | None = None  # this copy's: loaded, not yet taken
        self.seen = 0  # the generation this copy knows of
        self.own = False  # `state` is a worker's own, loaded in that worker

    def load(self, state: dict[str, Any] | None, *, worker: bool = False) -> None:
        """The training process loaded ``state`` (None: an epoch's start, no position); or,
        ``worker``, a DataLoader worker loaded a state of its own (torchdata's
        ``StatefulDataLoader`` gives each worker its own): for this worker's next iteration
        alone, whatever the training process loaded."""
        import torch

        if worker:
            self.state, self.own = state, True
            return
        data = pickle.dumps(state)
        length = len(data) if len(data) <= self.BOX - 8 else -1
        self.box[:8] = torch.tensor([length], dtype=torch.int64).view(torch.uint8)
        if length >= 0:
            self.box[8 : 8 + length] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.gens[0] += 1
        self.state = state
        self.seen = int(self.gens[0])

    def pending(self) -> dict[str, Any] | None:
        """The state loaded and not yet taken: in the training process, until a worker has
        delivered a batch after taking it (None where none was loaded); in a worker, its
        own (torchdata's) until its iteration takes it."""
        if self.state is not None and not self.own and int(self.gens[1]) >= self.seen:
            self.state = None
        return self.state

    def take(self, worker: int | None, epoch: int | None = None) -> dict[str, Any] | None:
        """The state an iteration starting now resumes from: ``worker`` (None: the training
        process itself) takes the latest state loaded, once.  An iteration of ``epoch``
        (None: any) resumes from a state of that epoch only: one of another was set aside
        by a later ``set_epoch``.  A worker's own state (torchdata's) holds whatever the
        epoch.

        Raises:
            ValueError: a running worker's state is too large for the shared box, or it is
                worker ``WORKERS`` or later.
        """
        if worker is None:  # iterated in the training process: once, if no worker took it
            state, self.state = self.pending(), None
            return _of(state, epoch)
        if not 0 <= worker < self.WORKERS:
            raise ValueError(
                f"DataLoader worker {worker}: an ImageDataset runs in at most "
                f"{self.WORKERS} workers a DataLoader"
            )
        latest = int(self.gens[0])
        if self.own:  # this worker's own, once; what the training process loaded is past
            state, self.state, self.own = self.state, None, False
            self.seen = max(self.seen, latest)
            self.taken[worker] = self.seen
            return state
        if latest > self.seen:  # loaded after this worker's copy was made: in the box
            self.state, self.seen = self._unbox(), latest
        if int(self.taken[worker]) >= self.seen:  # an earlier iteration of it took it
            self.state = None
        self.taken[worker] = self.seen
        state, self.state = self.state, None
        return _of(state, epoch)

    def delivered(self) -> None:
        """A worker delivered a batch of an iteration that began with what it knows of."""
        if int(self.gens[1]) < self.seen:
            self.gens[1] = self.seen

    def _unbox(self) -> dict[str, Any] | None:
        import torch

        length = int(self.box[:8].view(torch.int64)[0])
        if length < 0:
            raise ValueError(
                "the resume state loaded into the dataset is larger than "
                f"{self.BOX - 8} bytes, too large to reach DataLoader workers already "
                "running (persistent_workers=True): load it before the workers start, or "
                "make the DataLoader anew"
            )
        state: dict[str, Any] | None = pickle.loads(bytes(self.box[8 : 8 + length].numpy()))
        return state


def _of(state: dict[str, Any] | None, epoch: int | None) -> dict[str, Any] | None:
    """``state`` where it is of ``epoch`` (None: any), else None."""
    if state is None or epoch is None or int(state["epoch"]) == epoch:
        return state
    return None
