"""A training process that deletes its DataLoader after a few batches, ``rounds`` times:
two spawned workers of an endless dataset of large tensors, which register
``let_feeders_finish_at_exit`` as an ``ImageDataset``'s workers do (``hook``).  Run as a
child of the test, which reads its stderr for workers that aborted at exit."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from asyncloader._base._worker_exit import let_feeders_finish_at_exit


class Endless(IterableDataset[torch.Tensor]):
    """``mb`` MB float32 tensors without end."""

    def __init__(self, mb: int, hook: bool) -> None:
        self.mb = mb
        self.hook = hook

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.hook:
            let_feeders_finish_at_exit()
        while True:
            yield torch.ones(self.mb * 1024 * 256)


def main(rounds: int, mb: int, hook: bool) -> None:
    for _ in range(rounds):
        dl = DataLoader(
            Endless(mb, hook),
            batch_size=None,
            num_workers=2,
            multiprocessing_context="spawn",
            prefetch_factor=4,
        )
        it = iter(dl)
        for _ in range(3):
            next(it)
        del it  # the workers' next tensors still on their way
        time.sleep(0.2)
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "hook")
