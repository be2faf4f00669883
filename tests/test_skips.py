"""``on_error="skip"`` as a newcomer meets it: the samples left out are named (in
``stats()``, the summary and one warning each, the first ten), and a failure budget
exceeded is one short error that says how many of how many, the rule, the keys and what to
do, each failure printed once."""

from __future__ import annotations

import logging
import shutil
import traceback
from pathlib import Path

import pytest

import asyncloader as al

from .conftest import N_IMAGES


@pytest.fixture
def two_bad(jpeg_folder: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    data = tmp_path / "data"
    shutil.copytree(jpeg_folder, data)
    bad = sorted(data.rglob("*.jpg"))[3:5]
    for p in bad:
        p.write_bytes(b"not a jpeg")
    return data, [p.relative_to(data).as_posix() for p in bad]


def _loader(folder: Path, **kw: object) -> al.ImageLoader:
    return al.ImageLoader(
        str(folder),
        batch_size=16,
        shuffle=False,
        transform=al.CenterCrop(32),
        errors=al.ErrorConfig(on_error="skip", **kw),  # type: ignore[arg-type]
    )


def test_skipped_samples_are_named(
    two_bad: tuple[Path, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    folder, bad = two_bad
    with (
        caplog.at_level(logging.WARNING, logger="asyncloader"),
        _loader(
            folder,
            max_failures=2,
        ) as loader,
    ):
        assert sum(len(lab) for _, lab in loader) == N_IMAGES - 2
        stats = loader.stats()
    assert stats.skipped == {"DecodeError": 2}
    assert list(stats.skipped_keys) == bad
    assert f"skipped 2 (DecodeError 2) [{bad[0]}, {bad[1]}]" in stats.summary()
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert [w.split()[2] for w in warned] == bad


def test_a_failure_budget_exceeded_is_short_and_says_what_to_do(
    two_bad: tuple[Path, list[str]],
) -> None:
    folder, bad = two_bad
    with _loader(folder) as loader, pytest.raises(al.FailureBudgetExceeded) as info:
        for _ in loader:
            pass
    message = str(info.value)
    assert f"2 of the {N_IMAGES} samples of epoch 0 failed" in message
    assert "ErrorConfig(max_failures=0.01)" in message and "the default 0.01 is 1 %" in message
    assert f"{bad[0]}, {bad[1]}" in message
    assert "Raise ErrorConfig(max_failures=)" in message
    printed = "".join(traceback.format_exception(info.value))
    for key in bad:  # each failure once (not again inside the engine's traceback)
        assert printed.count(f"cannot decode {key}") == 1, printed
    assert len(printed.splitlines()) < 40, printed
