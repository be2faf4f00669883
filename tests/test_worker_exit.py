"""A DataLoader worker's exit while batches are still on their way: spawned workers deleted
mid-epoch do not abort in torch's C++ as their interpreter finalizes
(``_base/_worker_exit.py``), and an ImageDataset's workers register the hook that sees to
it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import asyncloader as al
from asyncloader._base import _worker_exit
from asyncloader._base._worker_exit import wait_for_feeders
from asyncloader.testing import S3TestServer
from asyncloader.torch import ImageDataset

ROOT = Path(__file__).resolve().parent.parent


def test_spawned_workers_deleted_mid_epoch_do_not_abort_at_exit() -> None:
    """Two spawned workers of 8 MB tensors, deleted after 3 batches, 5 times: without the
    hook most of them abort ("terminate called without an active exception": their queue
    feeder thread in torch's C++ as the interpreter finalizes; benchmarks/worker_exit_abort.py
    counts it), with it none does."""
    out = subprocess.run(
        [sys.executable, "-m", "tests._worker_exit_child", "5", "8", "hook"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-3000:]
    assert "terminate called" not in out.stderr, out.stderr[-3000:]
    assert "killed by signal" not in out.stderr, out.stderr[-3000:]


def _with_hook_state(batch: Any) -> tuple[Any, int, list[int]]:
    """A collate function: runs in the worker, after the dataset's iterator started."""
    return batch, os.getpid(), list(_worker_exit._registered_in)


def test_an_image_dataset_s_workers_register_the_hook_once(light_server: S3TestServer) -> None:
    ds = ImageDataset(
        "s3://b/train/",
        batch_size=16,
        decode=al.DecodeConfig(workers=1),
        store=al.StoreConfig(options={"endpoint_url": light_server.endpoint}),
    )
    dl = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=_with_hook_state)
    got = list(dl)
    assert all(isinstance(images, torch.Tensor) for (images, _), _, _ in got)
    seen = {pid: registered for _, pid, registered in got}
    assert len(seen) == 2 and all(reg == [pid] for pid, reg in seen.items())
    assert _worker_exit._registered_in != [os.getpid()]  # not in the training process


def test_waiting_for_feeders_ends_with_them_or_at_its_limit() -> None:
    done = threading.Event()
    quick = threading.Thread(target=done.wait, args=(0.05,), name="QueueFeederThread")
    other = threading.Thread(target=done.wait, name="not-a-feeder", daemon=True)
    quick.start()
    other.start()
    assert wait_for_feeders(5.0) == 0 and not quick.is_alive()
    stuck = threading.Thread(target=done.wait, name="QueueFeederThread", daemon=True)
    stuck.start()
    assert wait_for_feeders(0.1) == 1  # given up on: the exit goes on
    done.set()
    stuck.join()
    other.join()
