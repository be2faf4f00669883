"""The small CNN with the loader's health in TensorBoard: every N steps, the scalars of the
stretch (samples/s, the training loop's wait for batches, decode utilisation, request
latencies, the cache, the bound), under torchrun the job's max and mean over ranks and
the slowest rank.

    pip install 'asyncloader[tensorboard]'
    python examples/train_logged.py --steps 200
    python -m torch.distributed.run --nproc_per_node=2 examples/train_logged.py --steps 200
    tensorboard --logdir runs      # the "loader" section

Rank 0 starts the demo's moto_server (or --url reads a bucket of your own) and writes to
``--logdir``; every rank takes part in the job's figures.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter
from train_cnn import small_cnn
from train_ddp import job_arguments, job_data

import asyncloader as al
from asyncloader.testing import free_port
from asyncloader.torch import ImageDataset, to_device


def main() -> None:
    p = job_arguments(__doc__, steps=200, images=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--every", type=int, default=20, help="log the loader every N steps")
    p.add_argument("--logdir", default="runs/asyncloader")
    args = p.parse_args()
    if "RANK" not in os.environ:  # one process: a job of one, for the same code path
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with contextlib.ExitStack() as stack:
        url, options = job_data(args.url, args.endpoint_url, args.images, stack)
        ds = ImageDataset(
            url,
            batch_size=args.batch_size,
            transform=al.RandomResizedCrop(96),
            store=al.StoreConfig(options=options),
        )
        dl = DataLoader(ds, batch_size=None, num_workers=2)
        writer = SummaryWriter(args.logdir) if rank == 0 else None
        # Every rank logs at the same steps (the job's figures are a collective); only
        # rank 0 writes them.
        logger = al.LoaderLogger(dl, writer, every=args.every)
        model = small_cnn(len(ds.classes))
        if dist.get_world_size() > 1:
            model = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step, epoch, figures = 0, 0, None
        while step < args.steps:
            ds.set_epoch(epoch)
            # The batches as the step takes them (to_device(dl, "cuda") on a GPU), each wait
            # timed; the loader's counts come from the dataset's DataLoader workers.
            for images, labels in logger.timed(to_device(dl, "cpu")):
                loss = nn.functional.cross_entropy(model(images), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                figures = logger.step(step) or figures
                if writer is not None:
                    writer.add_scalar("train/loss", loss.item(), step)
                if step == args.steps:
                    break
            epoch += 1
        if rank == 0 and figures is not None:
            wait = "wait_seconds" if "wait_seconds" in figures else "wait_seconds/max"
            print(f"step {step}: loader scalars logged to {args.logdir}", flush=True)
            print(f"last stretch: training loop waited {figures[wait]:.2f} s", flush=True)
            if "wait_seconds/slowest_rank" in figures:
                print(f"slowest rank: {figures['wait_seconds/slowest_rank']:.0f}", flush=True)
        if writer is not None:
            writer.close()
        dist.barrier()  # rank 0 keeps the emulator up until every rank is done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
