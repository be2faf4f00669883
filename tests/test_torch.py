"""asyncloader.torch.ImageDataset inside torch.utils.data.DataLoader (fork and spawn)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import asyncloader as al
from asyncloader.testing import S3TestServer
from asyncloader.torch import ImageDataset, dist_shard, to_device

from .conftest import N_IMAGES, stacks_if_hung


class KeyIndex:
    """A picklable label function: the sample's index in the sorted key list."""

    def __init__(self, keys: list[str]) -> None:
        self.index = {k: i for i, k in enumerate(sorted(keys))}

    def __call__(self, key: str) -> int:
        return self.index[key]


def _dataset(server: S3TestServer, seed: int = 5, **kw: Any) -> ImageDataset:
    """The light server's folder in batches of 8, each sample labelled by its key's index."""
    keys = [k[len("train/") :] for k in server.stats()["keys"] if k.endswith(".jpg")]
    return ImageDataset(
        "s3://b/train/",
        batch_size=8,
        seed=seed,
        labels=KeyIndex(keys),
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),
        **kw,
    )


def _plain_epochs(
    server: S3TestServer, ds: ImageDataset, epochs: list[int]
) -> list[list[list[int]]]:
    """The labels of each batch of ``epochs`` from one plain loader of ``ds``'s options."""
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=8,
        seed=5,
        labels=ds.options["labels"],
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),
    ) as plain:
        out = []
        for epoch in epochs:
            plain.set_epoch(epoch)
            out.append([lab.tolist() for _, lab in plain])
        return out


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_cover_the_epoch_in_order(
    light_server: S3TestServer, context: str
) -> None:
    ds = _dataset(light_server)
    expected = _plain_epochs(light_server, ds, [1])[0]
    dl = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=stacks_if_hung if context == "fork" else None,
    )
    ds.set_epoch(1)
    got = []
    for images, labels in dl:
        assert images.dtype == torch.uint8
        assert tuple(images.shape[1:]) == (3, 224, 224)
        got.append(labels.tolist())
    assert got == expected  # same batches, same order as one plain loader
    assert sorted(x for b in got for x in b) == list(range(N_IMAGES))


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_run_the_epoch_set_epoch_chose(
    light_server: S3TestServer, context: str
) -> None:
    """``persistent_workers=True``: the workers, started once, keep their copy of the
    dataset; ``set_epoch`` in the training process still chooses each epoch's order (not
    epoch 0's again and again), as with workers started anew each epoch."""
    ds = _dataset(light_server)
    expected = _plain_epochs(light_server, ds, [0, 1, 2])
    assert expected[0] != expected[1] != expected[2]
    dl = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
        worker_init_fn=stacks_if_hung if context == "fork" else None,
    )
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        assert [labels.tolist() for _, labels in dl] == expected[epoch], epoch


def test_a_dataset_has_classes_and_a_length(
    light_server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's size and a schedule's steps_per_epoch, from the dataset: its classes as
    its loaders label them, and the batches a rank's DataLoader yields per epoch, with no
    loader started."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    opts = al.StoreConfig(options={"endpoint_url": light_server.endpoint})
    ds = ImageDataset("s3://b/train/", batch_size=10, transform=al.CenterCrop(16), store=opts)
    with al.ImageLoader("s3://b/train/", batch_size=10, store=opts) as plain:
        assert ds.classes == plain.classes and len(ds.classes) > 1
    assert ds._loader is None  # counted, nothing started
    for workers in (0, 2):
        dl = DataLoader(ds, batch_size=None, num_workers=workers)
        assert len(dl) == len(ds) == sum(1 for _ in dl) == -(-(N_IMAGES // 2) // 10)
    ds.close()
    short = ImageDataset(
        "s3://b/train/",
        batch_size=10,
        samples_per_epoch=35,
        shard=al.ShardConfig(drop_last=True),
        store=opts,
    )
    assert len(short) == 1 == sum(1 for _ in short)  # 18 samples a rank: one whole batch
    short.close()


def test_dataset_without_workers_and_shard_from_env(
    light_server: S3TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert dist_shard() == (1, 2)
    ds = _dataset(light_server)
    try:
        n = sum(len(lab) for _, lab in ds)
        assert n == N_IMAGES // 2
        assert ds.state_dict()["world_size"] == 2
    finally:
        ds.close()
    with pytest.raises(TypeError, match="rank and world_size are set by the dataset"):
        ImageDataset("s3://b/train/", rank=0)


def test_device_on_the_dataset_and_to_device_after_workers(light_server: S3TestServer) -> None:
    ds = _dataset(light_server)
    ds.options["shuffle"] = False
    direct = ImageDataset("s3://b/train/", device="cpu", **ds.options)
    try:
        expected = [(images.clone(), labels.clone()) for images, labels in direct]
    finally:
        direct.close()
    assert expected[0][0].dtype == torch.float32
    dl = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        worker_init_fn=stacks_if_hung,
    )
    got = [(images.clone(), labels) for images, labels in to_device(dl, "cpu")]
    assert len(got) == len(expected)
    for (a, la), (b, lb) in zip(got, expected, strict=True):
        assert torch.equal(la, lb)
        assert torch.equal(a, b)  # the same arithmetic as the loader's own uploader
    in_workers = ImageDataset("s3://b/train/", device="cpu", **ds.options)
    with pytest.raises(ValueError, match="device= belongs to the training process"):
        list(DataLoader(in_workers, batch_size=None, num_workers=1))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_on_the_dataset_and_to_device_from_pinned_workers(
    light_server: S3TestServer,
) -> None:
    """On a GPU: ``ImageDataset(device="cuda")`` and ``to_device`` over a DataLoader with
    ``pin_memory=True`` deliver what the CPU path delivers, bit for bit, on the device."""
    ds = _dataset(light_server)
    ds.options["shuffle"] = False
    cpu = ImageDataset("s3://b/train/", device="cpu", dtype="float16", **ds.options)
    try:
        expected = [(images.clone(), labels.clone()) for images, labels in cpu]
    finally:
        cpu.close()
    dl = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        pin_memory=True,
        multiprocessing_context="fork",
        worker_init_fn=stacks_if_hung,
    )
    via_workers = list(to_device(dl, "cuda", dtype="float16"))
    direct = ImageDataset("s3://b/train/", device="cuda", dtype="float16", **ds.options)
    try:
        on_gpu = [(images.clone(), labels.clone()) for images, labels in direct]
    finally:
        direct.close()
    for got in (via_workers, on_gpu):
        assert len(got) == len(expected)
        for (a, la), (b, lb) in zip(got, expected, strict=True):
            assert a.device.type == "cuda" and a.dtype == torch.float16
            assert torch.equal(la.cpu(), lb)
            assert torch.equal(a.cpu(), b)
