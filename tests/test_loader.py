"""The whole loader on each cloud backend (S3 on moto_server, Azure on Azurite, GCS on
fake-gcs-server): coverage, determinism, labels, bad input."""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import asyncloader as al
from asyncloader.testing import FaultProxy

from .conftest import N_CLASSES, N_IMAGES, Backend, jpeg_bytes


def _key_index(jpeg_folder: Path) -> dict[str, int]:
    keys = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    return {k: i for i, k in enumerate(keys)}


def _loader(url: str, backend: Backend, **kw: object) -> al.ImageLoader:
    """A loader of ``url`` on ``backend``; its engine inline unless a test says otherwise:
    each backend's store in engine processes (which open it from its options) is in
    :func:`test_every_sample_once_per_epoch_and_deterministic` and the bad-input test."""
    kw.setdefault("engine", al.EngineConfig(mode="inline"))
    kw.setdefault("batch_size", 16)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    given = kw.pop("store", None) or al.StoreConfig()
    store = dataclasses.replace(given, options=backend.store_options)  # type: ignore[arg-type]
    return al.ImageLoader(url, **kw, store=store)  # type: ignore[arg-type]


def test_every_sample_once_per_epoch_and_deterministic(
    backend: Backend, dataset: str, jpeg_folder: Path
) -> None:
    index = _key_index(jpeg_folder)
    orders = {}
    with _loader(dataset, backend, labels=index.__getitem__, seed=7) as loader:
        assert len(loader) == -(-N_IMAGES // 16)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen = []
            for images, labels in loader:
                assert images.dtype.is_floating_point is False
                assert tuple(images.shape[1:]) == (3, 224, 224)
                assert len(images) == len(labels) <= 16
                seen += labels.tolist()
            assert sorted(seen) == list(range(N_IMAGES)), f"epoch {epoch} not exactly once"
            orders[epoch] = seen
        first = next(iter(loader))  # epoch 2, prefetched
        pixels = first[0].clone()
        stats = loader.stats()
    assert orders[0] != orders[1]
    assert stats.skipped == {} and stats.samples >= 2 * N_IMAGES
    # Same seed and epoch → the same batches, pixel for pixel (augmentation included).
    with _loader(
        dataset, backend, labels=index.__getitem__, seed=7, engine=al.EngineConfig(processes=2)
    ) as again:
        again.set_epoch(1)
        assert [int(x) for _, lab in again for x in lab] == orders[1]
        again.set_epoch(2)
        images, _ = next(iter(again))
        assert np.array_equal(images.numpy(), pixels.numpy())


def test_imagefolder_labels_and_classes(backend: Backend, dataset: str) -> None:
    with _loader(dataset, backend, shuffle=False, batch_size=N_IMAGES) as loader:
        assert loader.classes == tuple(f"class_{i:02d}" for i in range(N_CLASSES))
        _, labels = next(iter(loader))
    assert Counter(labels.tolist()) == {c: N_IMAGES // N_CLASSES for c in range(N_CLASSES)}


def _proxied(backend: Backend, proxy: FaultProxy) -> dict[str, object]:
    return backend.options_at(proxy.endpoint)


def test_an_unshuffled_run_starts_before_the_listing_ends(
    backend: Backend, dataset: str, tmp_path: Path
) -> None:
    """The listing of the last class folder is held at a proxy: the first batches still
    arrive (from the first folders), and the whole epoch — labels and pixels — equals a run
    from the complete listing (saved in the cache by the first run)."""
    last = f"class_{N_CLASSES - 1:02d}"
    kw: dict[str, object] = dict(
        shuffle=False,
        batch_size=8,
        decode=al.DecodeConfig(workers=2),
        timeout=60,
        cache_dir=tmp_path / "c",
    )
    with FaultProxy(backend.server.endpoint) as proxy:
        gate = proxy.hold(f"prefix=train/{last}/")
        with al.ImageLoader(
            dataset, **kw, store=al.StoreConfig(options=_proxied(backend, proxy))
        ) as loader:  # type: ignore[arg-type]
            # Batches are views of ring slots, valid until the next one: keep copies.
            it = ((x.clone(), y.clone()) for x, y in loader)
            first = [next(it) for _ in range(3)]  # 24 images: class_00 is complete
            assert loader.stats().objects_listed == 0  # the listing is still running
            gate.set()
            streamed = first + list(it)
            assert loader.stats().objects_listed == N_IMAGES
            assert loader.classes == tuple(f"class_{i:02d}" for i in range(N_CLASSES))
    with al.ImageLoader(
        dataset, **kw, store=al.StoreConfig(options=backend.store_options)
    ) as loader:  # type: ignore[arg-type]
        assert loader.stats().listing_seconds < 1  # the saved listing: no streaming
        complete = [(x.clone(), y.clone()) for x, y in loader]
    assert [lab.tolist() for _, lab in streamed] == [lab.tolist() for _, lab in complete]
    assert all(
        np.array_equal(a.numpy(), b.numpy())
        for (a, _), (b, _) in zip(streamed, complete, strict=True)
    )
    labels = [x for _, lab in streamed for x in lab.tolist()]
    assert labels == sorted(labels) and len(labels) == N_IMAGES


def test_a_listing_that_fails_midway_fails_the_run(dataset: str, backend: Backend) -> None:
    """A sub-folder listing refused: the run fails with that error, whether it comes before
    the first batch (at construction) or after it."""
    if backend.name == "s3":
        pytest.skip("one backend is enough: the error path is the store's, tested in conformance")
    last = f"class_{N_CLASSES - 1:02d}"
    with FaultProxy(backend.server.endpoint) as proxy:
        proxy.fail_next(1, status=403, code="AccessDenied", path_contains=f"prefix=train/{last}/")
        opts = _proxied(backend, proxy)
        with pytest.raises(al.AccessDenied, match=last):
            with al.ImageLoader(
                dataset,
                shuffle=False,
                batch_size=8,
                timeout=60,
                store=al.StoreConfig(options=opts),
            ) as loader:  # type: ignore[arg-type]
                for _ in loader:
                    pass


def test_manifest_labels_and_missing_object(backend: Backend, tmp_path: Path) -> None:
    backend.create_bucket("man")
    for i in range(6):
        backend.put("man", f"imgs/{i}.jpg", jpeg_bytes(color=(i * 40, 0, 0)))
    rows = [{"key": f"{i}.jpg", "label": "cat" if i % 2 else "dog"} for i in range(6)]
    rows.append({"key": "missing.jpg", "label": "cat"})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(r) for r in rows))
    common = dict(batch_size=4, shuffle=False, labels=str(manifest))
    with _loader(backend.url("man", "imgs/"), backend, **common) as loader:
        assert loader.classes == ("cat", "dog")
        with pytest.raises(al.ObjectNotFound, match=r"missing\.jpg") as info:
            for _ in loader:
                pass
        assert any("stage=fetch" in n for n in getattr(info.value, "__notes__", []))
    with _loader(
        backend.url("man", "imgs/"),
        backend,
        **common,
        errors=al.ErrorConfig(on_error="skip", max_failures=1),
    ) as loader:
        got = [lab.tolist() for _, lab in loader]
        assert got == [[1, 0, 1, 0], [1, 0]]  # dog=1, cat=0; the missing one skipped
        assert loader.stats().skipped == {"ObjectNotFound": 1}


@pytest.mark.parametrize("engines", [1, 2])
def test_corrupt_truncated_and_bomb_images(backend: Backend, engines: int) -> None:
    # With two engines, failures and samples come from either, in their batches' order.
    backend.create_bucket("bad")
    good = jpeg_bytes()
    backend.put("bad", "c/ok1.jpg", good)
    backend.put("bad", "c/ok2.jpg", good)
    backend.put("bad", "c/corrupt.jpg", b"\xff\xd8\xff\xe0 this is not a jpeg at all")
    backend.put("bad", "c/truncated.jpg", good[: len(good) // 2])
    buf = io.BytesIO()
    Image.new("RGB", (4000, 3000)).save(buf, "JPEG")  # 12 Mpx, tiny file
    backend.put("bad", "c/bomb.jpg", buf.getvalue())
    common = {
        "shuffle": False,
        "decode": al.DecodeConfig(workers=2, max_pixels=1_000_000),
        "engine": al.EngineConfig(processes=engines),
    }
    with _loader(backend.url("bad"), backend, **common) as loader:
        with pytest.raises(al.DecodeError, match=r"c/bomb\.jpg.*decompression bomb"):
            list(loader)
    # Not an image (an error page saved under a .jpg name): the message shows its first
    # bytes, not Pillow's name for an in-memory file.
    backend.create_bucket("page")
    backend.put("page", "c/page.jpg", b"<!DOCTYPE html><html>Access Denied</html>")
    with _loader(backend.url("page"), backend, **common) as loader:
        with pytest.raises(
            al.DecodeError,
            match=r"c/page\.jpg: UnidentifiedImageError: not an image format Pillow reads "
            r"\(41 bytes, starting 3c 21 44 4f 43 54 59 50 45 20 68 74 6d 6c 3e 3c\)",
        ):
            list(loader)
    with _loader(
        backend.url("bad"),
        backend,
        **common,
        errors=al.ErrorConfig(on_error="skip", max_failures=3),
    ) as loader:
        batches = [len(images) for images, _ in loader]
        assert batches == [2]
        assert loader.stats().skipped == {"DecodeError": 3}
    with _loader(
        backend.url("bad"),
        backend,
        **common,
        errors=al.ErrorConfig(on_error="skip", max_failures=2),
    ) as loader:
        with pytest.raises(al.FailureBudgetExceeded) as info:
            list(loader)
        assert len(info.value.exceptions) == 3
        assert {e.key for e in info.value.exceptions} == {  # type: ignore[attr-defined]
            "c/corrupt.jpg",
            "c/truncated.jpg",
            "c/bomb.jpg",
        }


def _raw_decode(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8).reshape(1, 3, 4)


def test_decode_hook_for_other_blobs(backend: Backend) -> None:
    backend.create_bucket("raw")
    for i in range(5):
        backend.put("raw", f"{i}.bin", bytes([i]) * 12)
    with _loader(
        backend.url("raw"),
        backend,
        shuffle=False,
        labels=None,
        batch_size=5,
        decode=al.DecodeConfig(hook=_raw_decode, sample_shape=(1, 3, 4)),
        store=al.StoreConfig(extensions=None),
    ) as loader:
        images, labels = next(iter(loader))
    assert images[:, 0, 0, 0].tolist() == [0, 1, 2, 3, 4]
    assert labels.tolist() == [-1] * 5


def test_a_sample_shape_the_transform_does_not_make_is_an_error(backend: Backend) -> None:
    # Without a decode hook, the transform decides the size: a different sample_shape would be
    # silently ignored, and batches would not be what the caller sized its model for.
    backend.create_bucket("shape")
    backend.put("shape", "c/a.jpg", jpeg_bytes())
    url = backend.url("shape")
    with pytest.raises(
        ValueError, match=r"sample_shape=\(3, 16, 16\)\) but images come out as \(3, 32, 32\)"
    ):
        _loader(
            url,
            backend,
            transform=al.CenterCrop(32),
            decode=al.DecodeConfig(sample_shape=(3, 16, 16)),
        )
    with _loader(
        url,
        backend,
        transform=al.CenterCrop(32),
        decode=al.DecodeConfig(sample_shape=(3, 32, 32)),
    ) as loader:
        images, _ = next(iter(loader))  # the same shape: allowed, as documentation
    assert tuple(images.shape) == (1, 3, 32, 32)


def test_empty_prefix_is_a_clear_error(backend: Backend) -> None:
    backend.create_bucket("empty")
    url = backend.url("empty")
    with pytest.raises(al.AsyncLoaderError, match=f"no samples under {url}"):
        _loader(url, backend)
