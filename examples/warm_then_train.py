"""Warm the local cache ahead of a run, then train from it (no GETs while training).

python examples/warm_then_train.py --steps 100
"""

from __future__ import annotations

import argparse

from train_cnn import train  # examples/ is the script's folder

import asyncloader as al
from asyncloader.testing import demo_bucket


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--cache-dir", default="cache/objects")
    args = p.parse_args()
    with demo_bucket(images=args.images) as bucket:
        url, endpoint = bucket.url, bucket.endpoint
        report = al.warm(url, args.cache_dir, store_options={"endpoint_url": endpoint})
        print("warm:", report.summary())
        with al.ImageLoader(
            url,
            batch_size=64,
            transform=al.RandomResizedCrop(96),
            cache_dir=args.cache_dir,
            device="cpu",
            store=al.StoreConfig(options={"endpoint_url": endpoint}),  # normalised float32 batches
        ) as loader:
            train(loader, args.steps)
            stats = loader.stats()
            print(stats.summary())
            print(f"GETs while training: {stats.requests}")


if __name__ == "__main__":
    main()
