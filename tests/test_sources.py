"""Several sources mixed by weight, through the whole loader against real servers: two
stores (S3 on moto, Azure on Azurite or GCS on its emulator) mixed 3:1 and 1:1, each
source's share of every 10 batches, exactly once where the weights are the sizes (whatever
the engine processes), resume and elastic resume mid-epoch exact, classes as the union of
the sources' folders, and a source cached alone serving the mix."""

from __future__ import annotations

import io
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import asyncloader as al
from asyncloader.testing import Azurite, GCSEmulator, MotoServer

N_A, N_B = 48, 16
CLASSES = {"a": ("cat", "dog"), "b": ("dog", "eel")}
SHADE = {"cat": 40, "dog": 120, "eel": 200}  # a class's red: the label can be checked


def _jpeg(cls: str, i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), (SHADE[cls], (i * 7) % 256, 90)).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def _fill(server: MotoServer | Azurite | GCSEmulator, bucket: str, name: str, n: int) -> None:
    server.create_bucket(bucket)
    for i in range(n):
        cls = CLASSES[name][i % 2]
        server.put(bucket, f"set/{cls}/{i:03d}.jpg", _jpeg(cls, i))


@pytest.fixture(scope="module")
def stores(moto: MotoServer, gcs_emulator: GCSEmulator) -> dict[str, Any]:
    """Source a (48 images) on S3, source b (16) on GCS."""
    _fill(moto, "mix-a", "a", N_A)
    _fill(gcs_emulator, "mix-b", "b", N_B)
    return {
        "a": ("s3://mix-a/set/", {"endpoint_url": moto.endpoint}),
        "b": ("gs://mix-b/set/", {"endpoint_url": gcs_emulator.endpoint, "anonymous": True}),
    }


def _index(name: str, key: str) -> int:
    """A sample's identity: a's are 0..47, b's 48..63."""
    i = int(key.rsplit("/", 1)[1][:3])
    return i if name == "a" else N_A + i


def _sources(stores: dict[str, Any], weights: tuple[float, float] | None) -> list[al.Source]:
    return [
        al.Source(
            stores[name][0],
            weight=None if weights is None else weights[k],
            labels=partial(_index, name),  # picklable: engine processes get it
            store_options=stores[name][1],
        )
        for k, name in enumerate("ab")
    ]


def _loader(
    stores: dict[str, Any], weights: tuple[float, float] | None, **kw: Any
) -> al.ImageLoader:
    kw.setdefault("batch_size", 8)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("seed", 5)
    kw.setdefault("transform", al.CenterCrop(32))
    return al.ImageLoader(_sources(stores, weights), **kw)


def _epoch(loader: al.ImageLoader, epoch: int) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [labels.tolist() for _, labels, *_ in loader]


@pytest.mark.parametrize("weights", [(3.0, 1.0), (1.0, 1.0)])
def test_two_stores_mixed_by_weight(stores: dict[str, Any], weights: tuple[float, float]) -> None:
    """160 samples an epoch: each source gives its quota exactly; over any 10 batches each
    source's share is within 8 points of its weight (a sample is 1.25); each source draws
    without replacement (a sample repeats only once all of its source came round); the
    ``source`` extra and ``stats()`` say where each came from."""
    share_a = weights[0] / sum(weights)
    with _loader(stores, weights, samples_per_epoch=160, extras=("source",)) as loader:
        assert len(loader) == 20 and loader.num_samples == 160
        loader.set_epoch(0)
        batches, origins = [], []
        for _, labels, extras in loader:  # type: ignore[misc]
            batches.append(labels.tolist())
            origins += extras["source"]
        stats = loader.stats()
    flat = [x for b in batches for x in b]
    from_a = [x for x in flat if x < N_A]
    assert len(from_a) == round(160 * share_a)
    for start in range(len(batches) - 9):
        window = [x for b in batches[start : start + 10] for x in b]
        assert abs(sum(x < N_A for x in window) / len(window) - share_a) <= 0.08, start
    for name, ids, n in (("a", from_a, N_A), ("b", [x for x in flat if x >= N_A], N_B)):
        times = Counter(ids)
        assert len(set(times)) == min(len(ids), n)  # every sample before any repeats
        assert max(times.values()) - min(times.values()) <= 1, name
    url = dict(zip("ab", (s.split("/")[2] for s in (stores["a"][0], stores["b"][0])), strict=True))
    for x, origin in zip(flat, origins, strict=True):
        assert url["a" if x < N_A else "b"] in origin
    assert stats.samples_by_source == Counter(origins)
    assert "sources: " in stats.summary()


def test_without_weights_every_sample_once_whatever_the_engines(stores: dict[str, Any]) -> None:
    """No weights: each source gives its size, so an epoch is every sample of both once;
    the same seed gives the same batches with one engine process, two, or inline."""
    runs = []
    for engine in (
        al.EngineConfig(processes=1),
        al.EngineConfig(processes=2),
        al.EngineConfig(mode="inline"),
    ):
        with _loader(stores, None, engine=engine) as loader:
            assert loader.num_samples == N_A + N_B
            runs.append(_epoch(loader, 1))
    assert sorted(x for b in runs[0] for x in b) == list(range(N_A + N_B))
    assert runs[0] == runs[1] == runs[2]


def test_classes_are_the_union_of_the_sources_folders(stores: dict[str, Any]) -> None:
    """Folder labels: cat and dog from a, dog and eel from b are 3 classes, dog one label
    in both; each image's label is its folder's (its red says which)."""
    sources = [al.Source(stores[n][0], store_options=stores[n][1]) for n in "ab"]
    with al.ImageLoader(
        sources,
        batch_size=16,
        transform=al.CenterCrop(32),
        decode=al.DecodeConfig(workers=2),
    ) as loader:
        assert loader.classes == ("cat", "dog", "eel")
        seen = Counter()
        for images, labels in loader:  # type: ignore[misc]
            red = images[:, 0].float().mean(dim=(1, 2)).numpy()
            for r, label in zip(red, labels.tolist(), strict=True):
                name = loader.classes[label]
                assert abs(r - SHADE[name]) < 12, (name, r)
                seen[name] += 1
    assert seen == {"cat": N_A // 2, "dog": N_A // 2 + N_B // 2, "eel": N_B // 2}


def _first(loader: al.ImageLoader, k: int) -> tuple[list[int], dict[str, Any]]:
    loader.set_epoch(0)
    it = iter(loader)
    seen = [x for _ in range(k) for x in next(it)[1].tolist()]
    return seen, loader.state_dict()


@pytest.mark.slow
def test_resume_and_elastic_resume_of_a_mix_are_exact(stores: dict[str, Any]) -> None:
    """96 samples an epoch mixed 2:1 (a and b both repeat): 2 ranks stop after 3 batches
    each; resumed on 1 rank, and on 3, the rest of the epoch is exactly what the
    uninterrupted run had left (as a multiset: samples repeat), with equal counts per rank;
    the same layout resumes at the very next batch."""
    # The engine in this process: the order is the point here (engines: the test above).
    kw: dict[str, Any] = {"samples_per_epoch": 96, "engine": al.EngineConfig(mode="inline")}
    whole = []
    for rank in range(2):
        with _loader(stores, (2.0, 1.0), rank=rank, world_size=2, **kw) as loader:
            whole.append(_epoch(loader, 0))
    everything = Counter(x for r in whole for b in r for x in b)
    consumed, saved = [], {}
    for rank in range(2):
        with _loader(stores, (2.0, 1.0), rank=rank, world_size=2, **kw) as loader:
            seen, state = _first(loader, 3)
        assert seen == [x for b in whole[rank][:3] for x in b]
        consumed += seen
        saved = saved or state
    assert saved["mix"] == "sizes 48,16 quotas 64,32" and saved["consumed"] == 48
    for world in (1, 3):
        rest = []
        for rank in range(world):
            with _loader(stores, (2.0, 1.0), rank=rank, world_size=world, **kw) as loader:
                loader.load_state_dict(saved)
                rest.append([x for _, lab, *_ in loader for x in lab.tolist()])
        assert len({len(r) for r in rest}) == 1
        assert Counter(consumed) + Counter(x for r in rest for x in r) == everything, world
    with _loader(stores, (2.0, 1.0), rank=1, world_size=2, **kw) as loader:
        loader.load_state_dict(saved)
        assert [lab.tolist() for _, lab, *_ in loader] == whole[1][3:]
    with _loader(stores, (1.0, 1.0), rank=0, world_size=2, **kw) as other:
        with pytest.raises(ValueError, match="mix"):
            other.load_state_dict(saved)  # another mix is another order


def test_a_source_cached_alone_serves_the_mix(stores: dict[str, Any], tmp_path: Path) -> None:
    """The SSD cache keys a source's objects as the source's own store does: after a loader
    of a alone filled it, the mix fetches only b's objects (each once)."""
    url_a, options_a = stores["a"]
    cache = str(tmp_path / "cache")
    with al.ImageLoader(
        url_a,
        batch_size=16,
        cache_dir=cache,
        store=al.StoreConfig(options=options_a),
        decode=al.DecodeConfig(workers=2),
    ) as alone:
        assert sum(len(lab) for _, lab in alone) == N_A
    with _loader(stores, None, cache_dir=cache) as mixed:
        assert sum(len(lab) for _, lab, *_ in mixed) == N_A + N_B
        stats = mixed.stats()
    assert stats.objects_fetched == N_B
    assert stats.cache_hits >= N_A


def test_mixes_that_cannot_be_are_refused(stores: dict[str, Any]) -> None:
    a, b = (al.Source(stores[n][0], store_options=stores[n][1]) for n in "ab")
    with pytest.raises(ValueError, match="every source a weight, or none"):
        al.ImageLoader([al.Source(a.url, weight=2.0, store_options=a.store_options), b])
    with pytest.raises(ValueError, match="no sources"):
        al.ImageLoader([])
    with pytest.raises(ValueError, match="shuffle='node' reads one source"):
        al.ImageLoader([a, b], shuffle="node")
    with pytest.raises(ValueError, match="not shuffle='node'"):
        al.ImageLoader(a.url, shuffle="node", samples_per_epoch=10)
    assert np.isclose(al.Source("s3://x/", weight=0.5).weight, 0.5)


def test_three_clouds_in_one_mix(stores: dict[str, Any], azurite: Azurite) -> None:
    """S3, GCS and Azure Blob in one loader, 1:1:1: each gives a third of every epoch."""
    _fill(azurite, "mix-c", "b", 8)
    url_c = f"az://{azurite.account}/mix-c/set/"
    options_c = {
        "account": azurite.account,
        "account_key": azurite.key,
        "endpoint_url": azurite.endpoint,
    }
    sources = [
        *(al.Source(stores[n][0], weight=1.0, store_options=stores[n][1]) for n in "ab"),
        al.Source(url_c, weight=1.0, store_options=options_c),
    ]
    with al.ImageLoader(
        sources,
        batch_size=8,
        samples_per_epoch=96,
        transform=al.CenterCrop(32),
        decode=al.DecodeConfig(workers=2),
    ) as loader:
        assert sum(len(lab) for _, lab, *_ in loader) == 96
        by_source = loader.stats().samples_by_source
    assert sorted(by_source.values()) == [32, 32, 32]
    assert any(url.startswith("az://") for url in by_source)


def test_warm_of_every_source_serves_the_mix(
    stores: dict[str, Any], moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``asyncloader warm URL URL``: each source warmed in turn; then the mix fetches
    nothing (its objects are the cache's, keyed as each source's own store keys them)."""
    from asyncloader._cli import main

    cache = str(tmp_path / "cache")
    # Both sources are on S3 here: one set of store options reaches them.
    moto.create_bucket("mix-d")
    for i in range(8):
        moto.put("mix-d", f"set/eel/{i:03d}.jpg", _jpeg("eel", i))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    urls = [stores["a"][0], "s3://mix-d/set/"]
    assert main(["warm", *urls, "--cache-dir", cache]) == 0
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the loader's store_options reach every source
    options = {"endpoint_url": moto.endpoint}
    with al.ImageLoader(
        urls,
        batch_size=8,
        cache_dir=cache,
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options=options),
    ) as mixed:
        assert sum(len(lab) for _, lab, *_ in mixed) == N_A + 8
        stats = mixed.stats()
    assert stats.objects_fetched == 0 and stats.cache_hits >= N_A + 8


def test_warm_takes_sources_with_their_own_store_options(
    stores: dict[str, Any], tmp_path: Path
) -> None:
    """``asyncloader.warm([Source(...), Source(...)])``: S3 and GCS into one cache, one
    report; the mix then reads every object from it."""
    cache = str(tmp_path / "cache")
    sources = _sources(stores, None)
    report = al.warm(sources, cache)
    assert (report.listed, report.warmed, report.failed) == (N_A + N_B, N_A + N_B, [])
    with _loader(stores, None, cache_dir=cache) as mixed:
        assert sum(len(lab) for _, lab, *_ in mixed) == N_A + N_B
        assert mixed.stats().objects_fetched == 0


def test_ls_describes_each_source(
    stores: dict[str, Any], moto: MotoServer, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    import json

    from asyncloader._cli import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    url = stores["a"][0]
    assert main(["ls", url, url.replace("/set/", "/set/dog/"), "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line)["samples"] for line in lines] == [N_A, N_A // 2]
    assert main(["ls", url, url, "--write-manifest", "m.jsonl"]) == 1
