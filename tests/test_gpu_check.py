"""The prepared device script (``benchmarks/gpu_check.sh``) works on any machine in its dry
mode: every step starts at a tiny size and ends ok, the steps that need CUDA skip where
there is none, and the benchmarks take the arguments the script gives them — so the script
is ready when a GPU machine is lent."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("tests", "upload", "decode", "node", "scale", "loader")


@pytest.mark.slow
# Six steps, each a few processes that import torch: ~70 s on 2 cores beside another test
# process, ~110 s beside two (.ci/run's three).  Each step is bounded by the script itself
# (100-240 s) and the whole by the subprocess's 480 s, so the suite's 120 s a test is not
# this test's bound.
@pytest.mark.timeout(540)
def test_the_device_script_runs_in_its_dry_mode(tmp_path: Path) -> None:

    out = tmp_path / "gpu-out"
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry"],
        # Not this test run's own pytest settings (an xdist worker's, say): a fresh run.
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
            "OUT": str(out),
        },
        capture_output=True,
        text=True,
        timeout=480,
        check=False,
    )
    steps = (out / "steps.log").read_text()
    assert done.returncode == 0, steps + done.stdout[-4000:] + done.stderr[-2000:]
    ended = {
        line.split(":")[0].removeprefix("STEP "): line.split(": ", 1)[1]
        for line in steps.splitlines()
        if line.startswith("STEP ")
    }
    assert set(ended) == set(STEPS)
    for step, how in ended.items():
        # GPU decode's benchmark too: its GPU part played on the CPU where there is no GPU.
        assert how.startswith("ok ("), (step, how)  # "ok (N s of LIMIT)"
    assert "ROI_DECODE" in (out / "env.log").read_text()
    # Every benchmark wrote its table or JSON.
    assert all((out / f"{name}.json").is_file() for name in ("node", "scale", "loader"))
    assert "img/s" in (out / "upload.log").read_text()
    decode = (out / "decode.log").read_text()
    for case in ("GPU decode, 1 cores", "GPU decode inline, 1 cores", "CPU decode, 1 cores"):
        assert case in decode, decode[-2000:]
    assert '"batches wrong": 0' in decode
