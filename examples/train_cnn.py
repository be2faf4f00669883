"""Train a small CNN (plain torch, no torchvision) from s3:// with asyncloader.

With no --url it streams the demo's data from a local moto_server it starts itself:

    python examples/train_cnn.py --steps 300
    python examples/train_cnn.py --url s3://bucket/train/ --steps 1000 --cache-dir /nvme/c
    python examples/train_cnn.py --device cuda   # batches arrive on the GPU, normalised

Batches come from the loader already normalised (ImageNet's mean and std), as float32 on
``--device``: the CPU by default, or the GPU, where they are copied and converted on a
stream of their own while the previous step runs.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch import nn

import asyncloader as al
from asyncloader.testing import demo_bucket


def small_cnn(classes: int) -> nn.Module:
    def block(i: int, o: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(i, o, 3, stride=2, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    return nn.Sequential(
        block(3, 16), block(16, 32), block(32, 64), block(64, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )  # fmt: skip


def train(loader: al.ImageLoader, steps: int) -> float:
    model = small_cnn(max(len(loader.classes), 2)).to(loader.device)  # where batches arrive
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, epoch, t0, loss = 0, 0, time.perf_counter(), torch.tensor(0.0)
    while step < steps:
        loader.set_epoch(epoch)
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 20 == 0 or step == steps:
                rate = step * loader_batch(loader) / (time.perf_counter() - t0)
                print(f"step {step} epoch {epoch} loss {loss.item():.3f} ({rate:.0f} img/s)")
            if step == steps:
                break
        epoch += 1
    return float(loss.item())


def loader_batch(loader: al.ImageLoader) -> int:
    return int(loader.state_dict()["batch_size"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="s3://bucket/prefix/ (default: the demo data on moto)")
    p.add_argument("--endpoint-url")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=96, help="training crop [pixels]")
    p.add_argument("--images", type=int, default=2000, help="demo images")
    p.add_argument("--cache-dir")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        url, endpoint = args.url, args.endpoint_url
        if url is None:
            url, endpoint = stack.enter_context(demo_bucket(images=args.images))[:2]
        options = {"endpoint_url": endpoint} if endpoint else {}
        loader = stack.enter_context(
            al.ImageLoader(
                url,
                batch_size=args.batch_size,
                transform=al.RandomResizedCrop(args.size),
                cache_dir=args.cache_dir,
                device=args.device,
                store=al.StoreConfig(options=options),
            )
        )
        train(loader, args.steps)
        print(loader.stats().summary())


if __name__ == "__main__":
    main()
