"""A DDP training job that checkpoints with torch.distributed.checkpoint and resumes on
another number of ranks:

    python -m torch.distributed.run --nproc_per_node=2 examples/train_dcp.py \
        --steps 6 --checkpoint ckpt
    python -m torch.distributed.run --nproc_per_node=1 examples/train_dcp.py \
        --steps 12 --checkpoint ckpt

Every ``--save-every`` steps (and at the last) the model, the optimizer and the data
position go into one checkpoint, ``dcp.save({"train": ..., "data": ds})``, a folder of its
own under ``--checkpoint``: the dataset is a
``Stateful`` like the model.  A job started with an existing checkpoint loads it and goes
on, on any number of ranks: the rest of the epoch is dealt among them, every sample not yet
seen coming once.  Rank 0 starts the demo's moto_server (with --url every rank reads that
URL directly).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from train_cnn import small_cnn
from train_ddp import job_arguments, job_data

import asyncloader as al
from asyncloader.torch import ImageDataset


class Training:
    """The model, the optimizer and the step count, as one DCP ``Stateful``."""

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt, self.step = model, opt, 0

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.step = state["step"]


def last_checkpoint(folder: str) -> str | None:
    """The latest complete checkpoint under ``folder`` (DCP writes ``.metadata`` last)."""
    if not os.path.isdir(folder):
        return None
    done = sorted(d for d in os.listdir(folder) if os.path.exists(f"{folder}/{d}/.metadata"))
    return os.path.join(folder, done[-1]) if done else None


def main() -> None:
    p = job_arguments(__doc__, steps=12, images=384)
    p.add_argument("--checkpoint", default="ckpt", help="a folder of checkpoints, one a save")
    p.add_argument("--save-every", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with contextlib.ExitStack() as stack:
        url, options = job_data(args.url, args.endpoint_url, args.images, stack)
        # Iterated in this process (device="cpu": normalised float32 batches), the dataset
        # knows which batches the loop received: its state is the rank's position.
        ds = ImageDataset(
            url,
            batch_size=16,
            transform=al.RandomResizedCrop(96),
            device="cpu",
            store=al.StoreConfig(options=options),
        )
        model = nn.parallel.DistributedDataParallel(small_cnn(10))
        training = Training(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        state = {"train": training, "data": ds}
        latest = last_checkpoint(args.checkpoint)
        if latest is not None:
            dcp.load(state, checkpoint_id=latest)
            if rank == 0:
                print(f"resumed at step {training.step}, epoch {ds.epoch}", flush=True)
        while training.step < args.steps:
            for images, labels in ds:
                loss = nn.functional.cross_entropy(model(images), labels)
                training.opt.zero_grad()
                loss.backward()
                training.opt.step()
                training.step += 1
                if training.step % args.save_every == 0 or training.step == args.steps:
                    where = os.path.join(args.checkpoint, f"step-{training.step:08d}")
                    dcp.save(state, checkpoint_id=where)
                if rank == 0:
                    print(
                        f"step {training.step} epoch {ds.epoch} loss {loss.item():.3f}", flush=True
                    )
                if training.step == args.steps:
                    break
            else:
                ds.set_epoch(ds.epoch + 1)
        dist.barrier()  # rank 0 keeps the emulator up until every rank is done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
