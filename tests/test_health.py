"""The loader's health where trainers look: flat scalars of a stretch (pure arithmetic,
property-tested), a loader's ``scalars(since=)``, and LoaderLogger writing them every N
steps to a real TensorBoard event file, from a loader in this process and from
DataLoader workers of two epochs.  The job's view over ranks runs under torchrun in
test_torchrun.py and with the example in test_examples.py."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._base._scalars import FIELDS, HIGHEST, TOTALS, Point, Waits, scalars
from asyncloader.testing import S3TestServer
from asyncloader.torch import ImageDataset

from .conftest import N_IMAGES

ROOT = Path(__file__).resolve().parents[1]

figures = st.floats(min_value=0, max_value=1e9, allow_nan=False)
points = st.builds(
    Point,
    at=st.floats(min_value=0, max_value=1e6),
    wall=st.floats(min_value=0, max_value=1e6),
    values=st.tuples(*[figures] * len(FIELDS)),
)


@given(points, st.lists(points, min_size=1, max_size=5))
def test_a_stretch_counts_the_difference_of_two_points(later: Point, parts: list[Point]) -> None:
    earlier = Point.combined(parts)
    bigger = Point(
        earlier.at + 1.0,
        earlier.wall + 1.0,
        tuple(
            e + lv if name in TOTALS else lv
            for name, e, lv in zip(FIELDS, earlier.values, later.values, strict=True)
        ),
    )
    out = scalars(bigger, earlier)
    assert list(out) == list(al.SCALARS)
    assert all(math.isfinite(v) for v in out.values())
    assert out["samples"] == pytest.approx(later.get("samples"), rel=1e-6, abs=1e-3)
    assert out["requests"] == pytest.approx(later.get("requests"), rel=1e-6, abs=1e-3)
    assert out["interval_seconds"] == pytest.approx(1.0)
    assert 0.0 <= out["wait_fraction"] <= 1.0
    assert 0.0 <= out["cache_hit_rate"] <= 1.0
    assert sum(out[f"bound_{s}"] for s in ("consumer", "decode", "fetch", "cache")) <= 1.0
    # Gauges are the later point's.
    assert out["ring_slots"] == bigger.get("ring_slots")


@given(st.lists(points, min_size=1, max_size=5))
def test_points_combine_and_travel_as_rows(parts: list[Point]) -> None:
    whole = Point.combined(parts)
    for i, name in enumerate(FIELDS):
        column = [p.values[i] for p in parts]
        want = max(column) if name in HIGHEST else sum(column)
        assert whole.values[i] == pytest.approx(want)
    assert Point.from_vector(whole.vector()) == whole
    later = parts[0].after(whole)  # a worker of a later epoch goes on from its predecessor
    assert later.get("samples") == pytest.approx(parts[0].get("samples") + whole.get("samples"))
    assert later.get("ring_full") == parts[0].get("ring_full")


def test_the_loop_s_own_waits_and_clock_replace_the_loader_s() -> None:
    p = Point(10.0, 10.0, tuple(0.0 for _ in FIELDS))
    out = scalars(p, p, Waits(batches=4, samples=128, seconds=1.0), span=4.0)
    assert (out["batches"], out["samples"], out["wait_seconds"]) == (4, 128, 1.0)
    assert out["wait_fraction"] == 0.25 and out["wait_ms_per_batch"] == 250.0
    assert out["samples_per_second"] == 32.0


def test_the_docs_list_every_scalar_as_the_code_says() -> None:
    page = (ROOT / "docs" / "tuning.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", page, re.M))
    assert {k: rows.get(k) for k in al.SCALARS} == al.SCALARS


def test_a_loader_s_scalars_since_the_last_call_the_epoch_and_the_start(
    light_server: S3TestServer,
) -> None:
    store = al.StoreConfig(options={"endpoint_url": light_server.endpoint})
    with al.ImageLoader(
        "s3://b/train/", batch_size=8, transform=al.Resize(32), store=store
    ) as loader:
        assert sum(len(labels) for _, labels in loader) == N_IMAGES
        first = loader.scalars()  # the first call: since the start
        assert (first["samples"], first["batches"]) == (N_IMAGES, N_IMAGES // 8)
        assert first["requests"] >= N_IMAGES and first["megabytes_fetched"] > 0
        assert first["decode_workers"] >= 1 and 0 < first["decode_utilization"] <= 1
        assert loader.scalars()["samples"] == 0  # nothing delivered since the last call
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert loader.scalars("epoch")["samples"] == 24
        assert loader.scalars("start")["samples"] == N_IMAGES + 24
        assert loader.scalars()["samples"] == 24
        with pytest.raises(ValueError, match="since"):
            loader.scalars("epochs")  # type: ignore[arg-type]


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files in ``folder``, as (step, value) rows."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("workers", [0, 2])
def test_the_logger_writes_a_tensorboard_file_from_a_dataloader(
    light_server: S3TestServer, tmp_path: Path, workers: int
) -> None:
    """Two epochs of a DataLoader over an ImageDataset (its workers new processes each
    epoch with 2 workers: their counts go on from the last epoch's), logged every 3 steps
    by a real SummaryWriter; the file holds what was delivered."""
    from torch.utils.tensorboard import SummaryWriter

    store = al.StoreConfig(options={"endpoint_url": light_server.endpoint})
    ds = ImageDataset("s3://b/train/", batch_size=8, transform=al.Resize(32), store=store)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    writer = SummaryWriter(str(tmp_path / "tb"))
    logger = al.LoaderLogger(dl, writer, every=3, prefix="data/")
    assert not logger.job  # one process: no job
    logged: list[dict[str, float]] = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        for _images, labels in logger:
            assert len(labels) == 8
            got = logger.step()
            if got is not None:
                logged.append(got)
    writer.close()
    steps = 2 * N_IMAGES // 8
    assert logger.steps == steps and len(logged) == steps // 3
    events = _events(tmp_path / "tb")
    assert set(events) == {f"data/{name}" for name in al.SCALARS}
    assert [s for s, _ in events["data/samples"]] == list(range(3, steps + 1, 3))
    assert sum(v for _, v in events["data/samples"]) == 8 * 3 * len(logged)
    assert all(v == 3 for _, v in events["data/batches"])
    requests = [v for _, v in events["data/requests"]]
    assert min(requests) >= 0 and sum(requests) >= N_IMAGES  # the loaders' own, per stretch
    assert max(v for _, v in events["data/decode_workers"]) >= 1
    assert max(v for _, v in events["data/megabytes_fetched"]) > 0
    ds.close()


def test_a_writer_with_log_gets_one_dict_per_log(light_server: S3TestServer) -> None:
    """The Weights & Biases shape: ``run.log(dict, step=)``."""

    class Run:
        def __init__(self) -> None:
            self.rows: list[tuple[dict[str, Any], int]] = []

        def log(self, row: dict[str, Any], step: int) -> None:
            self.rows.append((row, step))

    run = Run()
    store = al.StoreConfig(options={"endpoint_url": light_server.endpoint})
    with al.ImageLoader(
        "s3://b/train/", batch_size=16, transform=al.Resize(32), store=store
    ) as loader:
        logger = al.LoaderLogger(loader, run, every=2)
        for step, _ in enumerate(logger, 1):
            logger.step(step)
    assert [step for _, step in run.rows] == [2, 4, 6]
    assert all(row["loader/samples"] == 32 for row, _ in run.rows)
    assert set(run.rows[0][0]) == {f"loader/{name}" for name in al.SCALARS}


def test_what_the_logger_cannot_use_is_refused(light_server: S3TestServer) -> None:
    with pytest.raises(TypeError, match="ImageLoader, an ImageDataset or a DataLoader"):
        al.LoaderLogger([1, 2, 3])
    store = al.StoreConfig(options={"endpoint_url": light_server.endpoint})
    with al.ImageLoader("s3://b/train/", batch_size=16, store=store) as loader:
        with pytest.raises(TypeError, match="neither add_scalar"):
            al.LoaderLogger(loader, object())
        with pytest.raises(ValueError, match="every"):
            al.LoaderLogger(loader, every=0)
