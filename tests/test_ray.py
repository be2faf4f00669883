"""Ray Train (optional: ``pip install 'asyncloader[ray]'``; skipped without it): a
``TorchTrainer`` launches the same torch.distributed workers as torchrun (a process group
on a TCPStore, no torchrun environment), and ImageDataset shards itself across them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncloader.testing import TEST_ENV, S3TestServer

from .conftest import N_IMAGES

train_torch = pytest.importorskip("ray.train.torch", reason="ray[train] is not installed")


def _loop(config: dict[str, Any]) -> None:
    import hashlib
    import os

    import numpy as np
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from asyncloader import DecodeConfig, StoreConfig
    from asyncloader.torch import ImageDataset

    os.environ.update(config["env"])

    def digest(data: bytes) -> np.ndarray[Any, Any]:
        d = hashlib.blake2b(bytes(data), digest_size=16).digest()
        return np.frombuffer(d, np.uint8).reshape(1, 1, 16).copy()

    ds = ImageDataset(
        "s3://b/train/",
        batch_size=8,
        decode=DecodeConfig(hook=digest, sample_shape=(1, 1, 16), workers=1),
        store=StoreConfig(options={"endpoint_url": config["endpoint"]}),
    )
    seen = []
    for images, _ in DataLoader(ds, batch_size=None, num_workers=1):
        seen += [bytes(r).hex() for r in images.reshape(len(images), 16).tolist()]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, seen)
    if dist.get_rank() == 0:
        Path(config["out"]).write_text(json.dumps(gathered))


@pytest.mark.slow
def test_a_ray_train_job_of_two_workers_reads_every_sample_once(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    import ray
    from ray.train import ScalingConfig

    light_server.reset_stats()
    out = tmp_path / "seen.json"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = train_torch.TorchTrainer(
            _loop,
            train_loop_config={"endpoint": light_server.endpoint, "env": TEST_ENV, "out": str(out)},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        )
        trainer.fit()
    finally:
        ray.shutdown()
    ranks = json.loads(out.read_text())
    seen = [d for r in ranks for d in r]
    assert len(ranks) == 2 and len(ranks[0]) == len(ranks[1])
    assert len(seen) == len(set(seen)) == N_IMAGES
