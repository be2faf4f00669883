"""The examples run as README documents them (small sizes), each against its own emulator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncloader.testing import TEST_ENV, free_port

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # As from a fresh shell: no AWS credentials; the examples use the emulator's own.
    env = {k: v for k, v in os.environ.items() if k not in TEST_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["TMPDIR"] = str(cwd)  # what a run leaves there (torchrun's log folder) goes with it
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_train_cnn(tmp_path: Path) -> None:
    out = _run(
        [
            sys.executable,
            str(EXAMPLES / "train_cnn.py"),
            "--steps",
            "6",
            "--images",
            "64",
            "--batch-size",
            "16",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 6 epoch 1 loss" in out.stdout


@pytest.mark.slow
def test_warm_then_train(tmp_path: Path) -> None:
    out = _run(
        [sys.executable, str(EXAMPLES / "warm_then_train.py"), "--steps", "2", "--images", "128"],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "warm: 128 objects warmed" in out.stdout
    assert "GETs while training: 0" in out.stdout


@pytest.mark.slow
def test_train_ddp_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    out = _run(
        [
            *cmd,
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(EXAMPLES / "train_ddp.py"),
            "--steps",
            "2",
            "--images",
            "64",
            "--manifest",
            "train.npz",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 2 epoch 1 loss" in out.stdout  # 32 samples per rank: a batch per epoch
    assert "manifest published: s3://" in out.stdout and "/train.npz" in out.stdout


@pytest.mark.slow
def test_train_dcp_resumes_on_another_number_of_ranks(tmp_path: Path) -> None:
    """README's checkpoint recipe: 2 ranks save with torch.distributed.checkpoint, a job
    of 1 rank loads the last checkpoint and goes on from its step."""
    torchrun = shutil.which("torchrun")
    cmd = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    for nproc, steps in ((2, 4), (1, 6)):
        out = _run(
            [
                *cmd,
                f"--nproc_per_node={nproc}",
                "--master_addr=127.0.0.1",
                f"--master_port={free_port()}",
                str(EXAMPLES / "train_dcp.py"),
                "--steps",
                str(steps),
                "--images",
                "96",
                "--checkpoint",
                "ckpt",
            ],
            tmp_path,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"step {steps} epoch" in out.stdout
    assert "resumed at step 4, epoch 1" in out.stdout  # 96 / 2 ranks / 16: 3 steps an epoch
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] == "step-00000006"


def test_train_captions(tmp_path: Path) -> None:
    args = ["--steps", "4", "--images", "48", "--batch-size", "16"]  # 3 batches an epoch
    out = _run([sys.executable, str(EXAMPLES / "train_captions.py"), *args], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "first caption: 'a " in out.stdout
    assert "step 4 epoch 1 loss" in out.stdout
