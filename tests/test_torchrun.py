"""A real ``torchrun --nproc_per_node=2`` (gloo, CPU) over moto_server: every sample of the
epoch exactly once across ranks and DataLoader workers, equal batch counts per rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from asyncloader.testing import MotoServer, S3TestServer, free_port

from .conftest import N_IMAGES

TRAIN = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from asyncloader.torch import ImageDataset

    class Key:
        def __call__(self, key):
            return int(key.rsplit("_", 1)[1].split(".")[0])  # img_000123.jpg -> 123

    def main():
        dist.init_process_group("gloo")
        endpoint, out = sys.argv[1:3]
        result = {}
        for even in ("pad", "drop"):  # one torchrun for both: starting one takes seconds
            ds = ImageDataset("s3://data/train/", batch_size=10, seed=1, labels=Key(),
                              even=even, store_options={"endpoint_url": endpoint})
            ds.set_epoch(3)
            labels, batches = [], 0
            for _, lab in DataLoader(ds, batch_size=None, num_workers=2):
                labels += lab.tolist()
                batches += 1
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, {"labels": labels, "batches": batches})
            result[even] = gathered
        if dist.get_rank() == 0:
            json.dump(result, open(out, "w"))
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def test_torchrun_two_ranks(moto: MotoServer, moto_dataset: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "ranks.json"
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run(
        [
            *cmd,
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(script),
            moto.endpoint,
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    for even, ranks in result.items():
        assert len(ranks) == 2
        assert ranks[0]["batches"] == ranks[1]["batches"]  # no DDP hang
        assert len(ranks[0]["labels"]) == len(ranks[1]["labels"])
        seen = ranks[0]["labels"] + ranks[1]["labels"]
        if even == "pad":
            assert set(seen) == set(range(N_IMAGES))  # N_IMAGES is even: nothing padded
            assert len(seen) == N_IMAGES
        else:
            assert len(seen) == len(set(seen)) == N_IMAGES
    assert sorted(result) == ["drop", "pad"]


LIST_JOB = textwrap.dedent(
    """
    import sys
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from asyncloader.torch import ImageDataset

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        ds = ImageDataset("s3://b/train/", batch_size=10, decode_workers=1,
                          store_options={"endpoint_url": sys.argv[1]})
        n = sum(len(lab) for _, lab in DataLoader(ds, batch_size=None, num_workers=2))
        total = [None] * dist.get_world_size()
        dist.all_gather_object(total, n)
        if dist.get_rank() == 0:
            print("samples", sum(total))
        dist.barrier()
        dist.destroy_process_group()
    """
)


def test_a_job_of_two_ranks_and_two_workers_each_lists_once(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """Rank 0 lists and broadcasts; each rank's dataset carries the list to its DataLoader
    workers: the store sees the LIST requests of one listing, not of 2 × 2 (and no cache is
    needed for it)."""
    import asyncloader as al

    light_server.reset_stats()
    with al.ImageLoader(
        "s3://b/train/", batch_size=10, store_options={"endpoint_url": light_server.endpoint}
    ):
        one_listing = light_server.stats()["counters"]["list"]
    assert one_listing >= 1
    light_server.reset_stats()
    script = tmp_path / "job.py"
    script.write_text(LIST_JOB)
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run(
        [
            *cmd,
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(script),
            light_server.endpoint,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"samples {N_IMAGES}" in proc.stdout
    assert light_server.stats()["counters"]["list"] == one_listing
