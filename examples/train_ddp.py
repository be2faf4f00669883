"""The small CNN under DDP: one process per rank, the dataset shards itself.

    python -m torch.distributed.run --nproc_per_node=2 examples/train_ddp.py --steps 50

Rank 0 starts the demo's moto_server and shares its endpoint; with --url every rank
reads that URL directly.  With --manifest (a key beside the images, ``train.npz``, or a
URL), rank 0 publishes the listing there first and every rank reads that one object
instead of listing — what later jobs on the same data do.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from train_cnn import small_cnn

import asyncloader as al
from asyncloader.testing import TEST_ENV, demo_bucket
from asyncloader.torch import ImageDataset, to_device


def job_data(
    url: str | None, endpoint: str | None, images: int, stack: contextlib.ExitStack
) -> tuple[str, dict[str, str]]:
    """The URL every rank reads and its store options: ``url``, or the demo's emulator
    bucket of ``images`` JPEGs, started on rank 0 (open as long as ``stack``) and named to
    the other ranks (the script's own set-up, before any loader)."""
    where = [url, endpoint]
    if url is None:
        for k, v in TEST_ENV.items():  # every rank uses the emulator's test credentials
            os.environ.setdefault(k, v)
        if dist.get_rank() == 0:
            where = list(stack.enter_context(demo_bucket(images=images))[:2])
    dist.broadcast_object_list(where, src=0)
    return str(where[0]), {"endpoint_url": str(where[1])} if where[1] else {}


def job_arguments(doc: str, steps: int, images: int) -> argparse.ArgumentParser:
    """The arguments every job example takes: ``--url`` and ``--endpoint-url`` (a bucket
    of your own; else the demo's emulator), ``--steps``, ``--images`` (of the demo)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--url")
    p.add_argument("--endpoint-url")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--images", type=int, default=images)
    return p


def main() -> None:
    p = job_arguments(__doc__, steps=50, images=2000)
    p.add_argument("--manifest", help="publish the listing there (.npz or .jsonl), then read it")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with contextlib.ExitStack() as stack:
        url, options = job_data(args.url, args.endpoint_url, args.images, stack)
        labels = "folder"
        if args.manifest:
            labels = args.manifest if "://" in args.manifest else url + args.manifest
            if rank == 0:
                al.describe(url, store_options=options, write_manifest=labels)
                print(f"manifest published: {labels}", flush=True)
            dist.barrier()  # written before any rank reads it
        ds = ImageDataset(
            url,
            batch_size=32,
            labels=labels,
            transform=al.RandomResizedCrop(96),
            store=al.StoreConfig(options=options),
        )
        model = nn.parallel.DistributedDataParallel(small_cnn(10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step, epoch = 0, 0
        while step < args.steps:
            ds.set_epoch(epoch)
            # uint8 batches from the worker, normalised to float32 by the uploader thread
            # (to_device(..., "cuda") would deliver them on this rank's GPU).
            batches = DataLoader(ds, batch_size=None, num_workers=1)
            for images, labels in to_device(batches, "cpu"):
                loss = nn.functional.cross_entropy(model(images), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if rank == 0 and (step % 10 == 0 or step == args.steps):
                    print(f"step {step} epoch {epoch} loss {loss.item():.3f}", flush=True)
                if step == args.steps:
                    break
            epoch += 1
        dist.barrier()  # rank 0 keeps the emulator up until every rank is done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
