"""The examples run as README documents them (small sizes), each against its own emulator."""

from __future__ import annotations

import os
import re
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


def _torchrun(nproc: int) -> list[str]:
    """The launcher of ``nproc`` ranks on 127.0.0.1, as the docs run it."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    return [*launcher, "--master_addr=127.0.0.1", f"--master_port={free_port()}"]


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
    out = _run(
        [
            *_torchrun(2),
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
    for nproc, steps in ((2, 4), (1, 6)):
        out = _run(
            [
                *_torchrun(nproc),
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


def test_train_text_to_image_on_buckets(tmp_path: Path) -> None:
    args = ["--steps", "5", "--images", "45", "--batch-size", "4"]
    out = _run([sys.executable, str(EXAMPLES / "train_text_to_image.py"), *args], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 5 epoch 0 bucket " in out.stdout
    seen = out.stdout.split("buckets seen: ", 1)[1].split("\n", 1)[0]
    assert seen.count("(") >= 2  # batches of more than one shape
    assert "samples left out by filters=: " in out.stdout


@pytest.mark.slow
def test_train_logged_writes_the_job_s_loader_figures_to_tensorboard(tmp_path: Path) -> None:
    """The TensorBoard example under torchrun, 2 ranks: rank 0's event file holds the
    loader's scalars as the job's max and mean over the ranks, and the slowest rank."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = _run(
        [
            *_torchrun(2),
            str(EXAMPLES / "train_logged.py"),
            *("--steps", "8", "--images", "128", "--batch-size", "16", "--every", "4"),
            *("--logdir", "tb"),
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 8: loader scalars logged to tb" in out.stdout
    assert re.search(r"slowest rank: [01]\n", out.stdout)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "train/loss" in tags and "loader/wait_seconds/slowest_rank" in tags
    for name in ("samples", "wait_seconds", "decode_utilization", "requests"):
        assert {f"loader/{name}/max", f"loader/{name}/mean"} <= tags
        top = [e.value for e in acc.Scalars(f"loader/{name}/max")]
        mean = [e.value for e in acc.Scalars(f"loader/{name}/mean")]
        assert len(top) == 2 and all(t >= m >= 0 for t, m in zip(top, mean, strict=True))
    # Each rank took 4 batches of 16 in each stretch of 4 steps.
    assert [e.value for e in acc.Scalars("loader/samples/mean")] == [64.0, 64.0]
    assert [e.value for e in acc.Scalars("loader/samples/max")] == [64.0, 64.0]
    assert [e.step for e in acc.Scalars("loader/samples/max")] == [4, 8]
    assert all(e.value in (0, 1) for e in acc.Scalars("loader/wait_seconds/slowest_rank"))
