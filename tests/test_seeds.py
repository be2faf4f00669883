"""Per-sample seeds for a user's own randomness: a decode hook that takes ``seed`` gets each
sample's seed for the epoch, and ``extras=("seed",)`` delivers it beside the batch for a
transform run in the trainer. The seed is made from the loader's seed, the epoch and the
sample's place in the epoch's order — the one the built-in transforms draw from — so it is
the same under any engine, DataLoader worker or rank count and after resume, differs
between epochs, and differs between two draws of one sample in an epoch."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
import torch.utils.data

import asyncloader as al
from asyncloader._decode._image import takes_seed
from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES


def _seeded(data: bytes, seed: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The sample's seed (8 bytes, little-endian) and the first 8 bytes of its digest."""
    name = hashlib.blake2b(bytes(data), digest_size=8).digest()
    return np.frombuffer(seed.to_bytes(8, "little") + name, np.uint8).reshape(1, 1, 16).copy()


def _pairs(images: Any) -> list[tuple[str, int]]:
    rows = np.asarray(images).reshape(len(images), 16)
    return [(bytes(r[8:]).hex(), int.from_bytes(bytes(r[:8]), "little")) for r in rows]


def _options(server: S3TestServer, **kw: Any) -> dict[str, Any]:
    return {
        "batch_size": 8,
        "seed": 7,
        "extras": ("seed",),
        "labels": None,
        "decode": al.DecodeConfig(hook=_seeded, sample_shape=(1, 1, 16), workers=1),
        "store": al.StoreConfig(options={"endpoint_url": server.endpoint}),
        **kw,
    }


def _epoch(batches: Any) -> dict[str, int]:
    """Each sample's seed, by the hook and by the extra (which must agree)."""
    out: dict[str, int] = {}
    for images, _, extras in batches:
        for (name, seed), given in zip(_pairs(images), extras["seed"], strict=True):
            assert seed == given
            assert name not in out
            out[name] = seed
    return out


def test_which_hooks_take_a_seed() -> None:
    def plain(data: bytes) -> None: ...
    def keyword(data: bytes, *, seed: int) -> None: ...
    def anything(data: bytes, **kw: Any) -> None: ...
    def only_position(data: bytes, seed: int, /) -> None: ...

    assert not takes_seed(plain) and not takes_seed(None) and not takes_seed(len)
    assert takes_seed(keyword) and takes_seed(anything) and takes_seed(_seeded)
    assert not takes_seed(only_position)


@pytest.mark.slow
def test_a_sample_s_seed_is_the_same_under_any_engines_workers_and_resume(
    light_server: S3TestServer,
) -> None:
    with al.ImageLoader(
        "s3://b/train/", **_options(light_server, engine=al.EngineConfig(mode="inline"))
    ) as loader:
        base = _epoch(loader)
        loader.set_epoch(1)
        other = _epoch(loader)
    assert len(base) == len(other) == N_IMAGES
    assert len(set(base.values())) == N_IMAGES  # one seed a sample
    assert all(base[k] != other[k] for k in base)  # and another the next epoch

    with al.ImageLoader(
        "s3://b/train/", **_options(light_server, engine=al.EngineConfig(processes=2))
    ) as loader:
        assert loader.engine_processes == 2
        assert _epoch(loader) == base

    # A DataLoader of 2 workers, each with its loader: the same seed for every sample.
    from asyncloader.torch import ImageDataset

    inline = al.EngineConfig(mode="inline")
    ds = ImageDataset("s3://b/train/", **_options(light_server, engine=inline))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert _epoch(dl) == base

    # Stopped after 3 batches and resumed in a new loader: the rest with the same seeds.
    with al.ImageLoader("s3://b/train/", **_options(light_server, engine=inline)) as loader:
        it = iter(loader)
        head = _epoch(next(it) for _ in range(3))
        state = loader.state_dict()
    with al.ImageLoader("s3://b/train/", **_options(light_server, engine=inline)) as loader:
        loader.load_state_dict(state)
        tail = _epoch(loader)
    assert {**head, **tail} == base and len(head) + len(tail) == N_IMAGES


def test_the_seed_extra_is_what_the_built_in_transform_drew_from(
    light_server: S3TestServer,
) -> None:
    """With the built-in decode, ``"seed"`` is the seed its RandomResizedCrop drew from (the
    decode job's, which a hook is given: the test above checks the two agree): the same
    sample and epoch, the same value, whatever the engines."""
    got = []
    for engine in (al.EngineConfig(mode="inline"), al.EngineConfig(processes=2)):
        options = _options(light_server, engine=engine, labels=_index(light_server))
        del options["decode"]
        with al.ImageLoader("s3://b/train/", **options) as loader:
            got.append(
                {
                    label: seed
                    for _, labels, extras in loader  # type: ignore[misc]
                    for label, seed in zip(labels.tolist(), extras["seed"], strict=True)
                }
            )
    assert got[0] == got[1] and len(got[0]) == N_IMAGES


def _index(server: S3TestServer) -> Any:
    keys = sorted(k for k in server.stats()["keys"] if k.endswith(".jpg"))
    return {k.removeprefix("train/"): i for i, k in enumerate(keys)}.__getitem__


def test_a_sample_drawn_twice_gets_two_seeds_and_each_place_keeps_its_own_on_any_world(
    light_server: S3TestServer,
) -> None:
    """``samples_per_epoch`` twice the folder: every sample is drawn twice in the epoch,
    at two places of its order, so a hook gets two seeds for it (another crop each time);
    the same epoch on two ranks gives every draw the seed it had on one."""
    inline = al.EngineConfig(mode="inline")
    twice = 2 * N_IMAGES

    def draws(**kw: Any) -> list[tuple[str, int]]:
        options = _options(light_server, engine=inline, samples_per_epoch=twice, **kw)
        out: list[tuple[str, int]] = []
        with al.ImageLoader("s3://b/train/", **options) as loader:
            for images, _, extras in loader:  # type: ignore[misc]
                for (name, seed), given in zip(_pairs(images), extras["seed"], strict=True):
                    assert seed == given  # the hook's and the extra's
                    out.append((name, seed))
        return out

    one = draws()
    assert len(one) == twice
    by_name: dict[str, set[int]] = {}
    for name, seed in one:
        by_name.setdefault(name, set()).add(seed)
    assert len(by_name) == N_IMAGES and all(len(s) == 2 for s in by_name.values())
    ranks = draws(rank=0, world_size=2) + draws(rank=1, world_size=2)
    assert sorted(ranks) == sorted(one)
