"""README command 1, small: the demo runs end to end against moto_server (and Azurite)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


def _demo(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
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
            "--cache-dir",
            str(tmp_path / "cache"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_demo_runs(tmp_path: Path) -> None:
    out = _demo(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "96 samples in 6 batches" in out.stdout
    # One rate for one run (a second, "images/s" over another span, disagreed with it).
    assert len(re.findall(r"\d+ (?:samples|images)/s", out.stdout)) == 1, out.stdout
    assert "samples/s" in out.stdout
    assert "loader CPU: " in out.stdout and "ms per image, all its processes" in out.stdout
    assert "bound by:" in out.stdout
    assert "what limited this run: " in out.stdout
    # (Epochs stream back to back, so epoch 1 may be fetched before epoch 0 is stored.)
    assert re.search(r"cache: \d+ hits .* [1-9]\d* stored", out.stdout), out.stdout
    # A later run (a fresh emulator with the same objects) reads everything from the cache.
    again = _demo(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"cache: [1-9]\d* hits .* 0 misses", again.stdout), again.stdout


@pytest.mark.usefixtures("azurite")  # skips (or fails in CI) without azurite installed
def test_demo_on_azurite(tmp_path: Path) -> None:
    out = _demo(tmp_path, "--store", "azure", "--no-cache")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "streaming az://devstoreaccount1/asyncloader-demo/train/ from Azurite" in out.stdout
    assert "96 samples in 6 batches" in out.stdout


def test_a_data_folder_made_again_with_other_counts_holds_only_the_new_images(
    tmp_path: Path,
) -> None:
    from asyncloader.testing._demo import make_jpeg_folder

    root = tmp_path / "jpegs"
    (root / "notes.txt").parent.mkdir()
    (root / "notes.txt").write_text("not ours")  # anything else in the folder stays
    make_jpeg_folder(root, images=12, classes=3)
    first = (root / "class_00" / "img_000000.jpg").read_bytes()
    assert len(list(root.rglob("*.jpg"))) == 12
    make_jpeg_folder(root, images=5, classes=2)  # fewer images, fewer classes
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))
    assert names == [
        f"class_{i % 2:02d}/img_{i:06d}.jpg" for i in sorted(range(5), key=lambda i: (i % 2, i))
    ]
    assert not (root / "class_02").exists()
    assert (root / "notes.txt").read_text() == "not ours"
    assert (root / "class_00" / "img_000000.jpg").read_bytes() == first  # same seed, same bytes
    make_jpeg_folder(root, images=5, classes=2)  # the same again: reused as it is
    assert len(list(root.rglob("*.jpg"))) == 5
