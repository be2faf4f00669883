"""Nothing silently ignored (a user's first week): a ``dtype`` or a normalisation asked for
without a device is done on the CPU, not dropped; a flat folder under the default
``labels="folder"`` gets a word (one class ``''``, every label 0 is rarely what was meant)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

import asyncloader as al
from asyncloader._dataset import _labels

INLINE = al.EngineConfig(mode="inline")


def _flat(jpeg_folder: Path, tmp_path: Path, n: int = 12) -> Path:
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, p in enumerate(sorted(jpeg_folder.rglob("*.jpg"))[:n]):
        shutil.copy(p, flat / f"{i:03d}.jpg")
    return flat


def test_a_dtype_or_a_normalisation_without_a_device_is_done_on_the_cpu(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    url = str(_flat(jpeg_folder, tmp_path))
    common = {"batch_size": 4, "transform": al.CenterCrop(16), "shuffle": False, "labels": None}
    with al.ImageLoader(url, **common) as plain:  # type: ignore[arg-type]
        raw, _ = next(iter(plain))
        raw = raw.clone()
        assert raw.dtype == torch.uint8 and plain.device == torch.device("cpu")
    with al.ImageLoader(url, dtype="float16", **common) as half:  # type: ignore[arg-type]
        images, _ = next(iter(half))
        assert images.dtype == torch.float16
        mean = torch.tensor(al.IMAGENET_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(al.IMAGENET_STD).view(1, 3, 1, 1)
        want = (raw.float() / 255 - mean) / std
        assert torch.allclose(images.float(), want, atol=2e-2)
    plain_scale = al.OutputConfig(mean=None, std=None)
    with al.ImageLoader(url, output=plain_scale, **common) as scaled:  # type: ignore[arg-type]
        images, _ = next(iter(scaled))
        assert images.dtype == torch.float32
        assert torch.allclose(images, raw.float() / 255)


def test_a_flat_folder_under_the_default_labels_gets_a_word(
    jpeg_folder: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = str(_flat(jpeg_folder, tmp_path))
    monkeypatch.setattr(_labels, "_said_flat", False)
    with caplog.at_level(logging.WARNING, logger="asyncloader"):
        with al.ImageLoader(url, batch_size=4, engine=INLINE) as loader:
            assert loader.classes == ("",)
            _, labels = next(iter(loader))
            assert labels.tolist() == [0, 0, 0, 0]
    said = [r.getMessage() for r in caplog.records if "in no class folder" in r.getMessage()]
    assert len(said) == 1
    assert "labels=None" in said[0]
    caplog.clear()
    monkeypatch.setattr(_labels, "_said_flat", False)
    with caplog.at_level(logging.WARNING, logger="asyncloader"):
        with al.ImageLoader(url, batch_size=4, labels=None, engine=INLINE) as loader:
            _, labels = next(iter(loader))
            assert labels.tolist() == [-1] * 4  # asked for none: no word
    assert not [r for r in caplog.records if "in no class folder" in r.getMessage()]
