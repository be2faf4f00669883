"""The loader's health where trainers look: scalars logged every N steps, per rank or as the
job's max and mean over ranks.

:class:`LoaderLogger` iterates a loader (an :class:`~asyncloader.ImageLoader`, an
``ImageDataset``, or a DataLoader over one), timing each wait of the training loop for a
batch itself, and every ``every`` steps logs :data:`~asyncloader.SCALARS` of the stretch
since the last log to a TensorBoard ``SummaryWriter`` (``add_scalar``) or anything with a
``log(dict, step=)`` (Weights & Biases).  :func:`job_scalars` turns a rank's scalars into
the job's, over ``torch.distributed``: each figure's max and mean, and which rank waited
longest.  :class:`WorkerPoints` is the table in shared memory through which DataLoader
workers hand their loaders' counts to the training process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from .._base._scalars import FIELDS, Point, Waits, scalars

if TYPE_CHECKING:
    import torch

__all__ = ["LoaderLogger", "WorkerPoints", "job_scalars"]

T = TypeVar("T")


class PointSource(Protocol):
    def health_point(self) -> Point:
        """What the loader (or a rank's DataLoader workers) has counted now."""


def job_scalars(local: dict[str, float], group: Any = None) -> dict[str, float]:
    """The job's view of every rank's ``local`` scalars: ``NAME/max`` and ``NAME/mean``
    over the ranks of ``group`` (default: the whole job), and ``wait_seconds/slowest_rank``,
    the rank that waited longest for batches (the one a node's throughput waits for).

    A collective: every rank of the group calls it, with the same names.  Without an
    initialised ``torch.distributed`` the job is this process alone.
    """
    import torch
    import torch.distributed as dist

    names = list(local)
    row = torch.tensor([float(local[n]) for n in names], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend(group) == "nccl":
            row = row.to(torch.device("cuda", torch.cuda.current_device()))
        rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, row, group=group)
        table = torch.stack(rows).cpu()
    else:
        table = row.unsqueeze(0)
    out: dict[str, float] = {}
    for i, name in enumerate(names):
        out[f"{name}/max"] = float(table[:, i].max())
        out[f"{name}/mean"] = float(table[:, i].mean())
    if "wait_seconds" in names:
        slowest = int(table[:, names.index("wait_seconds")].argmax())
        if dist.is_available() and dist.is_initialized() and group is not None:
            slowest = dist.get_global_rank(group, slowest)
        out["wait_seconds/slowest_rank"] = float(slowest)
    return out


class LoaderLogger:
    """Log a loader's scalars every ``every`` steps, where a trainer plots them::

        writer = SummaryWriter() if rank == 0 else None   # torch.utils.tensorboard
        logger = asyncloader.LoaderLogger(dataloader, writer, every=100)
        for epoch in range(epochs):
            dataset.set_epoch(epoch)
            for images, labels in logger:          # the DataLoader's batches
                ...                                # the training step
                logger.step()

    Iterating the logger iterates ``source`` and times each wait for a batch in this loop
    (with DataLoader workers, the loaders are in the workers: this is the wait that
    counts); ``logger.timed(to_device(dataloader, "cuda"))`` times the batches the step
    takes where something stands between (an uploader's waits are the loop's).
    ``step()`` counts a step; every ``every``-th it takes the scalars of the stretch since
    the last log (:meth:`scalars`), under ``job`` the job's max and mean over ranks
    (:func:`job_scalars`), writes them as ``prefix + name`` and returns them.

    Args:
        source: An :class:`~asyncloader.ImageLoader`, an ``ImageDataset``, or a DataLoader
            (any iterable with ``.dataset``) over an ``ImageDataset``.
        writer: A TensorBoard ``SummaryWriter`` (anything with ``add_scalar(tag, value,
            step)``) or a Weights & Biases run (anything with ``log(dict, step=)``); None:
            nothing written (a rank that only takes part in the job's figures).
        every: Log every this many steps.
        prefix: Put before each name (TensorBoard groups by the part before ``/``).
        job: Log the job's figures (a collective: every rank calls ``step()`` at the same
            steps); default: when ``torch.distributed`` is initialised with more than one
            rank.
        group: The process group of ``job`` (default: the whole job).

    Raises:
        TypeError: ``source`` is none of those, or ``writer`` has neither method.
    """

    def __init__(
        self,
        source: Iterable[Any],
        writer: Any = None,
        *,
        every: int = 100,
        prefix: str = "loader/",
        job: bool | None = None,
        group: Any = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        if writer is not None and not (hasattr(writer, "add_scalar") or hasattr(writer, "log")):
            raise TypeError(
                f"writer {type(writer).__name__} has neither add_scalar (TensorBoard) nor "
                "log (Weights & Biases)"
            )
        self.source = source
        self._points = _point_source(source)
        self.writer = writer
        self.every = every
        self.prefix = prefix
        self.job = _in_a_job() if job is None else job
        self.group = group
        self.steps = 0
        self._waits = Waits()  # the loop's own, since the logger was made
        # Where scalars(since=) counts from: the loader's point, the loop's waits, the time.
        made = (self._points.health_point(), self._waits, time.monotonic())
        self._marks: dict[str, tuple[Point, Waits, float]] = {"call": made, "epoch": made}

    def __iter__(self) -> Iterator[Any]:
        return self.timed(self.source)

    def timed(self, batches: Iterable[T]) -> Iterator[T]:
        """One epoch of ``batches``, each wait timed: the batches the training step takes
        where they are not ``source``'s own (``to_device(dataloader, "cuda")``, say)."""
        self._marks["epoch"] = (self._points.health_point(), self._waits, time.monotonic())
        return self._timed(iter(batches))

    def _timed(self, batches: Iterator[T]) -> Iterator[T]:
        while True:
            began = time.perf_counter()
            try:
                got = next(batches)
            except StopIteration:
                return
            w = self._waits
            self._waits = Waits(
                w.batches + 1, w.samples + _samples_in(got), w.seconds + time.perf_counter() - began
            )
            batch = [got]  # no reference kept in this frame while it waits at `yield`
            del got
            yield batch.pop()

    def scalars(self, since: Literal["call", "epoch"] = "call") -> dict[str, float]:
        """This rank's scalars of the stretch since the last log or ``scalars()`` call
        (``"call"``; the first: since the logger was made) or since the epoch's iteration
        began (``"epoch"``): the loader's counts, with the batches, samples and waits of
        this loop."""
        if since not in ("call", "epoch"):
            raise ValueError(f"since must be 'call' or 'epoch', not {since!r}")
        now = (self._points.health_point(), self._waits, time.monotonic())
        point, waits, then = self._marks[since]
        if since == "call":
            self._marks["call"] = now
        w = now[1]
        stretch = Waits(
            w.batches - waits.batches, w.samples - waits.samples, w.seconds - waits.seconds
        )
        return scalars(now[0], point, stretch, span=now[2] - then)

    def step(self, step: int | None = None) -> dict[str, float] | None:
        """Count a training step (``step``: the step's own number, for the writer and the
        every-N rule); every ``every``-th, log and return the figures, else None."""
        self.steps += 1
        at = self.steps if step is None else step
        if at % self.every:
            return None
        figures = self.scalars("call")
        if self.job:
            figures = job_scalars(figures, self.group)
        self.write(figures, at)
        return figures

    def write(self, figures: dict[str, float], step: int) -> None:
        """Write ``figures`` to the writer (if any) as ``prefix + name`` at ``step``."""
        writer = self.writer
        if writer is None:
            return
        if hasattr(writer, "add_scalar"):
            for name, value in figures.items():
                writer.add_scalar(self.prefix + name, value, step)
        else:
            writer.log({self.prefix + name: v for name, v in figures.items()}, step=step)


def _point_source(source: object) -> PointSource:
    for candidate in (source, getattr(source, "dataset", None)):
        if callable(getattr(candidate, "health_point", None)):
            return candidate  # type: ignore[return-value]
    raise TypeError(
        f"LoaderLogger reads an ImageLoader, an ImageDataset or a DataLoader over one, not "
        f"{type(source).__name__}"
    )


def _in_a_job() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _samples_in(batch: object) -> int:
    """The samples of a batch: the length of its labels (``(images, labels, ...)``)."""
    if isinstance(batch, tuple | list) and len(batch) >= 2:
        return len(batch[1])
    return len(batch) if hasattr(batch, "__len__") else 0  # type: ignore[arg-type]


class WorkerPoints:
    """Where a dataset's DataLoader workers leave their loaders' points for the training
    process: a table in shared memory (it travels to forked and spawned workers alike), a
    row per worker (the first 256), each written at most every ``EVERY`` seconds and at the
    end of each epoch, read as one point (:meth:`combined`).

    A worker of a later epoch (a new process, without ``persistent_workers``) goes on from
    its predecessor's totals, so a stretch across epochs counts both.  Rows are written
    under a sequence number (odd while written), so a reader never takes half of one.
    """

    ROWS = 256
    EVERY = 0.5

    def __init__(self) -> None:
        import torch

        table = torch.zeros(self.ROWS, 2 + 2 + len(FIELDS), dtype=torch.float64)
        self.table: torch.Tensor = table.share_memory_()  # type: ignore[no-untyped-call]
        self._reset()

    def _reset(self) -> None:
        self._pid = -1
        self._before: Point | None = None
        self._written = float("-inf")

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.table = state["table"]
        self._reset()

    def due(self) -> bool:
        """Whether a write now is at least ``EVERY`` seconds after the last one."""
        return time.monotonic() - self._written >= self.EVERY

    def write(self, worker: int, point: Point) -> None:
        """Leave ``point`` (the loader's of DataLoader worker ``worker``) in its row."""
        import torch

        if not 0 <= worker < self.ROWS:
            return
        row = self.table[worker]
        pid = os.getpid()
        if self._pid != pid:  # this process's first write: whose row was it?
            self._pid = pid
            last = self._read(worker)
            self._before = last[1] if last is not None and last[0] != pid else None
        if self._before is not None:
            point = point.after(self._before)
        values = torch.tensor([float(pid), *point.vector()], dtype=torch.float64)
        row[0] += 1  # odd: being written
        row[1:] = values
        row[0] += 1
        self._written = time.monotonic()

    def _read(self, worker: int) -> tuple[int, Point] | None:
        """Row ``worker`` as (its writer's pid, its point), None where none was written."""
        row = self.table[worker]
        for _ in range(1000):
            seq = float(row[0])
            copy = row.clone()
            if seq % 2 == 0 and float(row[0]) == seq:
                if seq == 0:
                    return None
                return int(copy[1]), Point.from_vector(copy[2:].tolist())
            time.sleep(0.0001)
        return None  # a writer that never finished (died mid-write): left out

    def combined(self) -> Point:
        """The workers' points as one (totals summed: the rank's loaders together)."""
        rows = (self._read(i) for i in range(self.ROWS) if float(self.table[i, 0]) > 0)
        return Point.combined([got[1] for got in rows if got is not None])
