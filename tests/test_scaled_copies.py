"""Scaled copies of large JPEGs: a copy decoded at its scale gives the original's pixels
exactly (any subsampling, grayscale, RGB, progressive input, any size); samples decoded from
copies in the cache are the samples decoded from the objects; a damaged copy is dropped and
the object decoded instead; ``warm --scaled-jpegs`` makes copies of objects cached before,
without fetching them."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._base._types import derived_key
from asyncloader._decode._image import (
    MAX_PIXELS,
    ROI_DECODE,
    SCALED_COPY_MIN,
    DecodeSpec,
    decode_into,
    decode_scale,
    scaled_copies,
    scaled_name,
)
from asyncloader.testing import S3TestServer

from .test_roi_decode import KINDS, _jpeg, _whole

pytestmark = pytest.mark.skipif(not ROI_DECODE, reason="_jpegroi extension not built")

N_LARGE = 6


def _scaled(data: bytes, scales: tuple[int, ...]) -> tuple[bytes | None, ...]:
    from asyncloader._decode import _jpegroi  # type: ignore[attr-defined]

    got: tuple[bytes | None, ...] = _jpegroi.scaled(data, scales, MAX_PIXELS)
    return got


def _photo(seed: int, size: tuple[int, int] = (2400, 1800)) -> bytes:
    """A JPEG of at least SCALED_COPY_MIN bytes, from the demo's real photos."""
    from asyncloader.testing._demo import make_jpeg, source_photos

    data = make_jpeg(source_photos(), seed, size=size)
    assert len(data) >= SCALED_COPY_MIN, len(data)
    return data


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from([*KINDS, "grayscale", "rgb"]),
    size=st.tuples(st.integers(8, 400), st.integers(8, 400)),
    scale=st.sampled_from([2, 4, 8]),
)
def test_a_copy_decodes_to_the_originals_pixels_at_its_scale(
    kind: str, size: tuple[int, int], scale: int
) -> None:
    w, h = size
    save: dict[str, object] = {"mode": "L"} if kind == "grayscale" else dict(KINDS.get(kind, {}))
    if kind == "rgb":
        save = {"keep_rgb": True}  # an RGB JPEG (Adobe marker), not YCbCr
    data = _jpeg(w, h, seed=w * h, **save)  # type: ignore[arg-type]
    (copy,) = _scaled(data, (scale,))
    if copy is None:  # nothing to gain (a tiny image): the object is decoded
        return
    assert len(copy) < len(data)
    assert np.array_equal(_whole(copy, scale), _whole(data, scale))


def test_copies_made_together_are_the_copies_made_one_by_one() -> None:
    # The coefficients are read once for all the scales asked for; each copy must start
    # from all of them (libjpeg drops a component's AC coefficients at a 1x1 block size).
    data = _jpeg(640, 480, seed=5)
    together = _scaled(data, (8, 2, 4))
    alone = tuple(_scaled(data, (s,))[0] for s in (8, 2, 4))
    assert together == alone
    assert all(c is not None for c in together)
    assert len(together[0]) < len(together[2]) < len(together[1]) < len(data)  # type: ignore[arg-type]


def test_a_large_photos_copies_are_small_and_exact() -> None:
    data = _photo(0)
    copies = dict(scaled_copies(data))
    assert set(copies) == {scaled_name(4), scaled_name(8)}
    assert len(copies[scaled_name(8)]) < 0.3 * len(data)
    for scale in (4, 8):
        assert np.array_equal(_whole(copies[scaled_name(scale)], scale), _whole(data, scale))


@pytest.mark.parametrize(
    "transform", [al.RandomResizedCrop(224), al.CenterCrop(224, resize=256), al.Resize(96)]
)
def test_samples_from_copies_are_the_samples_from_the_object(transform: al.Transform) -> None:
    datas = [_jpeg(1600, 1200, seed=s, subsampling=s % 3) for s in range(3)]
    datas.append(_jpeg(1200, 1600, seed=9, mode="L"))
    h, w = transform.output_size
    spec = DecodeSpec((3, h, w), transform=transform)
    a, b = np.empty((3, h, w), np.uint8), np.empty((3, h, w), np.uint8)
    used = set()
    for i, data in enumerate(datas):
        copies = dict(zip((4, 8), _scaled(data, (4, 8)), strict=True))
        for seed in range(40):
            scale = decode_scale(data, spec, seed)
            copy = copies.get(scale)
            if copy is None:
                continue
            assert decode_scale(copy, spec, seed) == scale  # the same header, the same plan
            decode_into(data, a, spec, seed, "k")
            decode_into(copy, b, spec, seed, "k")
            assert np.array_equal(a, b), (i, seed, scale)
            used.add(scale)
    assert used  # the test decoded from copies at all


def test_bucketed_samples_from_copies_are_the_samples_from_the_object() -> None:
    """A bucketed sample's crop (its bucket, the image's recorded size) tells its scale as
    a transform's does: decoded from the copy of that scale, the object's pixels."""
    b = al.make_buckets(224 * 224, ratios=(0.5, 2.0), step=32)
    spec = DecodeSpec((3, 1, b.max_pixels), buckets=b)
    used = set()
    for i, (w, h) in enumerate([(1600, 1200), (1200, 1600), (2400, 1800), (1000, 2000)]):
        data = _jpeg(w, h, seed=20 + i, subsampling=i % 3)
        copies = dict(zip((4, 8), _scaled(data, (4, 8)), strict=True))
        bh, bw = b.sizes[int(b.nearest([h], [w])[0])]
        mark = (bh, bw, h, w)
        for seed in range(10):
            scale = decode_scale(data, spec, seed, mark)
            assert scale in (4, 8)  # a bucket's crop covers the image: a small scale
            copy = copies[scale]
            assert copy is not None
            assert decode_scale(copy, spec, seed, mark) == scale
            a, c = np.empty((3, bh, bw), np.uint8), np.empty((3, bh, bw), np.uint8)
            decode_into(data, a, spec, seed, "k", mark)
            decode_into(copy, c, spec, seed, "k", mark)
            assert np.array_equal(a, c), (i, seed, scale)
            used.add(scale)
    assert used == {4, 8}


def test_what_gets_no_copies() -> None:
    from asyncloader._decode import _jpegroi  # type: ignore[attr-defined]

    photo = _photo(1)
    assert scaled_copies(photo[:-1000]) == []  # cut short: libjpeg warns, nothing is made
    assert scaled_copies(_jpeg(300, 200)) == []  # below SCALED_COPY_MIN
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (1200, 1000, 4), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise, "CMYK").save(buf, "JPEG", quality=95)
    assert len(buf.getvalue()) >= SCALED_COPY_MIN
    assert scaled_copies(buf.getvalue()) == []  # CMYK: Pillow decodes it whole
    buf = io.BytesIO()
    Image.fromarray(noise[:, :, :3]).save(buf, "PNG")
    assert scaled_copies(buf.getvalue()) == []
    assert scaled_copies(b"\xff\xd8" + bytes(SCALED_COPY_MIN)) == []  # not a JPEG inside
    for bad in ((3,), (4, 4), (1,), ("8",), 8):
        with pytest.raises((ValueError, TypeError)):
            _jpegroi.scaled(photo, bad, MAX_PIXELS)


def test_a_bomb_gets_no_copies_and_no_coefficient_is_read() -> None:
    # The frame header claims 30000 x 30000 pixels: its coefficients alone would take
    # 2.7 GB.  Refused from the header, as the decode refuses it.
    photo = _photo(2)
    sof = photo.index(b"\xff\xc0")
    assert photo[sof + 5 : sof + 9] == (1800).to_bytes(2, "big") + (2400).to_bytes(2, "big")
    bomb = photo[: sof + 5] + (30000).to_bytes(2, "big") * 2 + photo[sof + 9 :]
    with pytest.raises(Image.DecompressionBombError):  # Pillow reads the same header
        Image.open(io.BytesIO(bomb))
    assert scaled_copies(bomb) == []
    assert scaled_copies(photo, max_pixels=2400 * 1800 - 1) == []
    assert len(scaled_copies(photo, max_pixels=2400 * 1800)) == 2


# --- in the cache, through the loader and warm ------------------------------------------


@pytest.fixture(scope="module")
def large_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("large")
    for i in range(N_LARGE):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        (root / f"c{i % 2}" / f"p{i}.jpg").write_bytes(_photo(10 + i))
    return root


@pytest.fixture
def large_server(large_folder: Path) -> S3TestServer:
    with S3TestServer(load=large_folder, bucket="b", prefix="big/") as server:
        yield server


def _epochs(
    server: S3TestServer, epochs: int, **options: object
) -> tuple[list[torch.Tensor], al.Stats]:
    # Inline unless a test gives the engines (the copies are the cache's and the decode's,
    # in either mode: the engine-count test runs processes).
    options.setdefault("engine", al.EngineConfig(mode="inline"))
    options.setdefault("transform", al.RandomResizedCrop(160))
    loader = al.ImageLoader(
        "s3://b/big/",
        batch_size=2,
        shuffle=True,
        seed=7,
        timeout=60,
        **options,
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),  # type: ignore[arg-type]
    )
    try:
        images = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            images += [x.clone() for x, _ in loader]
        return images, loader.stats()
    finally:
        loader.close()


def _assert_every_object_has_copies(cache_dir: Path) -> None:
    cache = al.ObjectCache(cache_dir)
    try:
        entries = set(cache.entry_keys())
    finally:
        cache.close()
    objects = {k for k in entries if k.count("\x00") == 2}
    assert len(objects) == N_LARGE
    for key in objects:
        assert {derived_key(key, scaled_name(s)) for s in (4, 8)} <= entries


@pytest.mark.parametrize("engines", [1, 2])
def test_the_loader_makes_copies_and_decodes_from_them(
    large_server: S3TestServer, tmp_path: Path, engines: int
) -> None:
    engine = al.EngineConfig(processes=engines)
    plain, _ = _epochs(large_server, 3, engine=engine)
    cache_dir = tmp_path / "cache"
    first, _ = _epochs(
        large_server,
        1,
        cache_dir=cache_dir,
        cache=al.CacheConfig(scaled_jpegs=True),
        engine=engine,
    )
    _assert_every_object_has_copies(cache_dir)  # closing the loader wrote what it held
    # A later run on the same cache: every sample a hit, many from their copies.
    again, stats = _epochs(large_server, 3, cache_dir=cache_dir, engine=engine)
    assert stats.objects_fetched == 0 and stats.cache_scaled_hits > 0
    assert len(first) == len(plain) // 3 and len(again) == len(plain)
    for x, y in zip(first + again, plain[: len(first)] + plain, strict=True):
        assert torch.equal(x, y)


def test_a_bucketed_loader_decodes_from_the_copies(
    large_server: S3TestServer, tmp_path: Path
) -> None:
    """Bucketed batches read the copies as square crops do (a bucket covers the image: the
    1/8 copy of a 12-megapixel photo), and are the batches made from the objects."""
    buckets = {"transform": None, "buckets": al.make_buckets(192 * 192, step=32)}
    plain, _ = _epochs(large_server, 2, **buckets)
    cache_dir = tmp_path / "cache"
    opts = {"endpoint_url": large_server.endpoint}
    report = al.warm("s3://b/big/", cache_dir, store_options=opts, scaled_jpegs=True)
    assert report.scaled == N_LARGE
    again, stats = _epochs(large_server, 2, cache_dir=cache_dir, **buckets)
    assert stats.objects_fetched == 0
    # From copies: as many samples as were delivered, at least (more were decoded ahead).
    assert stats.cache_scaled_hits >= len(plain) * 2
    assert len(again) == len(plain)
    for x, y in zip(again, plain, strict=True):
        assert torch.equal(x, y)


def test_a_damaged_copy_is_dropped_and_the_object_decoded(
    large_server: S3TestServer, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    opts = {"endpoint_url": large_server.endpoint}
    report = al.warm("s3://b/big/", cache_dir, store_options=opts, scaled_jpegs=True)
    assert report.warmed == N_LARGE and report.scaled == N_LARGE
    cache = al.ObjectCache(cache_dir)
    try:
        keys = [k for k in cache.entry_keys() if k.endswith(scaled_name(8))]
        assert len(keys) == N_LARGE
        for where in cache.locate(keys).values():  # one byte of each 1/8 copy flipped
            assert where is not None and where.offset >= 0
            path = cache_dir / "packs" / where.filename
            with open(path, "r+b") as f:
                f.seek(where.offset + where.length // 2)
                byte = f.read(1)
                f.seek(where.offset + where.length // 2)
                f.write(bytes([byte[0] ^ 0xFF]))
    finally:
        cache.close()
    plain, _ = _epochs(large_server, 1)
    got, stats = _epochs(
        large_server,
        1,
        cache_dir=cache_dir,
    )
    assert stats.objects_fetched == 0 and stats.cache_damaged == N_LARGE
    assert stats.cache_scaled_hits == 0  # the 1/8 copy is read first, for the header
    for x, y in zip(got, plain, strict=True):
        assert torch.equal(x, y)


def test_warm_gives_objects_cached_before_their_copies_without_a_fetch(
    large_server: S3TestServer, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    opts = {"endpoint_url": large_server.endpoint}
    report = al.warm("s3://b/big/", cache_dir, store_options=opts)
    assert report.warmed == N_LARGE and report.scaled == 0
    report = al.warm("s3://b/big/", cache_dir, store_options=opts, scaled_jpegs=True)
    assert report.already_cached == N_LARGE and report.warmed == 0
    assert report.scaled == N_LARGE and report.bytes_fetched == 0
    assert "given scaled copies" in report.summary()
    report = al.warm("s3://b/big/", cache_dir, store_options=opts, scaled_jpegs=True)
    assert report.scaled == 0 and report.bytes_fetched == 0  # nothing left to do
    _assert_every_object_has_copies(cache_dir)


@pytest.mark.parametrize("how", ["warm", "loader"])
def test_a_cache_too_small_budgets_for_the_copies(
    large_server: S3TestServer, large_folder: Path, tmp_path: Path, how: str
) -> None:
    # The photos fit the cache, their copies with them do not: warm and the loader keep a
    # subset whose objects and copies fit, evicting nothing (else the oldest pack goes,
    # objects and all, and what is left is not the subset the other keeps).
    total = sum(p.stat().st_size for p in large_folder.rglob("*.jpg"))
    limit = int(total * 1.3)
    cache_dir = tmp_path / "cache"
    opts = {"endpoint_url": large_server.endpoint}
    if how == "warm":
        report = al.warm(
            "s3://b/big/", cache_dir, cache_size=limit, store_options=opts, scaled_jpegs=True
        )
        assert 0 < report.not_admitted < N_LARGE and not report.failed
        assert report.warmed == report.scaled == N_LARGE - report.not_admitted
    else:
        _, stats = _epochs(
            large_server,
            2,
            cache_dir=cache_dir,
            cache=al.CacheConfig(size=limit, scaled_jpegs=True),
        )
        assert 0 < stats.cache_share < 1
    cache = al.ObjectCache(cache_dir, size_limit=limit)
    try:
        entries = set(cache.entry_keys())
        assert cache.stats().volume <= limit
    finally:
        cache.close()
    objects = {k for k in entries if k.count("\x00") == 2}
    assert 0 < len(objects) < N_LARGE
    assert len(entries) == 3 * len(objects)  # each with its two copies: nothing evicted
    if how == "warm":
        assert len(objects) == report.warmed


def test_the_warm_command_makes_copies(large_server: S3TestServer, tmp_path: Path) -> None:
    args = ["warm", "s3://b/big/", "--cache-dir", str(tmp_path / "cache")]
    args += ["--endpoint-url", large_server.endpoint, "--scaled-jpegs"]
    proc = subprocess.run(
        [sys.executable, "-m", "asyncloader", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{N_LARGE} given scaled copies" in proc.stdout
    _assert_every_object_has_copies(tmp_path / "cache")


def test_scaled_copies_need_a_cache_and_the_built_in_decode(large_server: S3TestServer) -> None:
    opts = {"endpoint_url": large_server.endpoint}
    with pytest.raises(ValueError, match="scaled_jpegs"):
        al.ImageLoader(
            "s3://b/big/",
            cache=al.CacheConfig(scaled_jpegs=True),
            store=al.StoreConfig(options=opts),
        )
