"""README command 1, small: the demo runs end to end against moto_server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncloader",
            "demo",
            "--images",
            "48",
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--data-dir",
            str(tmp_path / "jpegs"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "96 samples in 6 batches" in out.stdout
    assert "images/s" in out.stdout and "ms of loader CPU per image" in out.stdout
    assert "bound by:" in out.stdout
