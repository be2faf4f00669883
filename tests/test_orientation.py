"""EXIF orientation, ``DecodeConfig(exif_orientation=True)``: a phone's portrait photo is
stored landscape with an orientation tag, and Hugging Face's ``datasets`` (and diffusers'
``load_image``) turn it upright with ``ImageOps.exif_transpose``.  With the option, every
decode path gives, bit for bit, Pillow's ``exif_transpose`` of the decoded image followed
by the same crop, resize and flip — the region decoder too, which decodes the stored region
that holds the crop and turns it; the crop is planned, the bucket chosen and
``original_size`` given for the upright image, from headers read once per node; a large
JPEG's scaled copies keep the orientation.  Without it, the pixels are as stored.

The reference is Pillow alone: ``Image.open``, for a JPEG ``draft`` at the size the crop
needs (in the stored image's axes), ``ImageOps.exif_transpose``, ``convert("RGB")``,
``resize(BILINEAR, box=)``.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps, PngImagePlugin

import asyncloader as al
from asyncloader._base._orientation import (
    TRANSPOSE,
    exif_segment,
    jpeg_turned,
    orientation,
    stored_box,
    upright_array,
    upright_size,
)
from asyncloader._dataset._imagesize import header_size
from asyncloader._dataset._sizes import _load, sizes_path
from asyncloader._decode._image import (
    SCALED_COPY_MIN,
    DecodeSpec,
    decode_into,
    decode_scale,
    scaled_copies,
)
from asyncloader._decode._transforms import bucket_plan
from asyncloader.testing import FaultProxy, MotoServer, bucket_reference

from ._png import late_exif_png

W, H = 97, 61  # stored landscape, odd: no block or row alignment hides an error
OUT = 24


def _picture(w: int = W, h: int = H, seed: int = 0) -> Image.Image:
    """Gradients and grain: every row and column differs, so a wrong turn shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255) // w, (y * 255) // h, ((x * 3 + y * 7) * 5) % 256], -1)
    arr = np.clip(base + rng.integers(-25, 26, (h, w, 3)), 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def _tagged(img: Image.Image, fmt: str, o: int, **kw: Any) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = o
    buf = io.BytesIO()
    img.save(buf, fmt, exif=exif, **kw)
    return buf.getvalue()


def _raw_profile_png(img: Image.Image, o: int, prefix: bool = True) -> bytes:
    """A PNG with its EXIF in a "Raw profile type exif" text chunk, as ImageMagick writes
    it (a name line, the length, the bytes in hex lines), no ``eXIf`` chunk; the block
    with its ``Exif\0\0`` prefix, or (``prefix=False``) the TIFF header first."""
    exif = Image.Exif()
    exif[0x0112] = o
    raw = exif.tobytes()  # with the prefix
    raw = raw if prefix else raw.removeprefix(b"Exif\x00\x00")
    hexed = raw.hex()
    lines = "\n".join(hexed[i : i + 72] for i in range(0, len(hexed), 72))
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", f"\nexif\n{len(raw):8d}\n{lines}\n", zip=True)
    buf = io.BytesIO()
    img.save(buf, "PNG", pnginfo=info)
    return buf.getvalue()


def pillow(
    data: bytes,
    box: tuple[float, float, float, float],
    size: tuple[int, int],
    upright: bool = True,
) -> np.ndarray:
    """Pillow's own upright decode of ``data`` for a crop of ``box`` (in the upright
    image) to ``size``: HWC RGB (``upright=False``: as stored, the box in it)."""
    with Image.open(io.BytesIO(data)) as probe:  # as exif_transpose reads it: loaded
        probe.load()
        o = probe.getexif().get(0x0112, 1) if upright else 1
        width, height = upright_size(*probe.size, o)
    img = Image.open(io.BytesIO(data))
    left, top, right, bottom = box
    if img.format == "JPEG":
        want = (
            math.ceil(width * size[0] / max(right - left, 1)),
            math.ceil(height * size[1] / max(bottom - top, 1)),
        )
        img.draft("RGB", upright_size(*want, o))
    turned = ImageOps.exif_transpose(img) if upright else img
    assert turned is not None
    sx, sy = turned.size[0] / width, turned.size[1] / height
    box = (left * sx, top * sy, right * sx, bottom * sy)
    return np.asarray(turned.convert("RGB").resize(size, Image.Resampling.BILINEAR, box=box))


def _kinds(o: int) -> dict[str, bytes]:
    pic = _picture()
    return {
        "jpeg": _tagged(pic, "JPEG", o, quality=92),
        "jpeg-gray": _tagged(pic.convert("L"), "JPEG", o, quality=92),
        "jpeg-large": _tagged(_picture(403, 251, 1), "JPEG", o, quality=90),  # DCT-scaled
        "jpeg-progressive": _tagged(pic, "JPEG", o, quality=92, progressive=True),
        "jpeg-cmyk": _tagged(pic.convert("CMYK"), "JPEG", o, quality=92),  # Pillow's path
        "png": _tagged(pic, "PNG", o),
        "png-raw-profile": _raw_profile_png(pic, o),  # ImageMagick's way
        "png-exif-after-pixels": late_exif_png(pic, o),
        "webp": _tagged(pic, "WEBP", o, lossless=True),
        "tiff": _tagged(pic, "TIFF", o),  # the tag among the TIFF's own
    }


# --- the geometry (pure) --------------------------------------------------------------------


def test_each_orientation_turns_an_array_as_pillow_turns_the_image() -> None:
    arr = np.asarray(_picture(7, 5))
    img = Image.fromarray(arr)
    for o, method in TRANSPOSE.items():
        assert np.array_equal(upright_array(arr, o), np.asarray(img.transpose(method))), o
    assert upright_array(arr, 1) is arr


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 12),
    st.integers(1, 12),
    st.data(),
)
def test_a_box_of_the_upright_image_is_the_same_pixels_in_the_stored_one(
    o: int, w: int, h: int, data: st.DataObject
) -> None:
    arr = np.arange(w * h).reshape(h, w)
    up = upright_array(arr, o)
    uw, uh = upright_size(w, h, o)
    assert up.shape == (uh, uw)
    x0 = data.draw(st.integers(0, uw - 1))
    x1 = data.draw(st.integers(x0 + 1, uw))
    y0 = data.draw(st.integers(0, uh - 1))
    y1 = data.draw(st.integers(y0 + 1, uh))
    left, top, right, bottom = (int(v) for v in stored_box((x0, y0, x1, y1), w, h, o))
    assert 0 <= left < right <= w and 0 <= top < bottom <= h
    assert np.array_equal(upright_array(arr[top:bottom, left:right], o), up[y0:y1, x0:x1])


def test_the_orientation_is_read_as_exif_transpose_reads_it() -> None:
    pic = _picture()
    for o in range(1, 9):
        for kind, data in _kinds(o).items():
            with Image.open(io.BytesIO(data)) as img:
                if kind == "png-exif-after-pixels":  # read once the pixels are: loaded
                    assert orientation(img) == 1
                    img.load()
                if kind == "tiff":  # Pillow turns a TIFF itself: its size is upright already
                    assert orientation(img) == 1 and img.size == upright_size(W, H, o)
                else:
                    assert orientation(img) == o, (kind, o)
            if kind.startswith("jpeg"):
                assert jpeg_turned(data) == (o != 1), (kind, o)
        with Image.open(io.BytesIO(_raw_profile_png(pic, o, prefix=False))) as img:
            assert orientation(img) == o == img.getexif().get(0x0112), o  # no prefix: Pillow's
    plain = io.BytesIO()
    pic.save(plain, "JPEG")
    with Image.open(plain) as img:
        assert orientation(img) == 1 and not jpeg_turned(plain.getvalue())
    # A damaged EXIF block, or a value no orientation has, turns nothing and fails nothing.
    for bad in (b"Exif\x00\x00MM\x00\x2a\x00\x00\xff\xff", exif_segment(9)[4:]):
        data = plain.getvalue()
        segment = b"\xff\xe1" + (len(bad) + 2).to_bytes(2, "big") + bad
        damaged = data[:2] + segment + data[2:]
        with warnings.catch_warnings():  # Pillow's own open warns of a damaged block
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(damaged)) as img:
                assert orientation(img) == 1
            assert not jpeg_turned(damaged)
    info = PngImagePlugin.PngInfo()  # a raw profile whose hex is not hex
    info.add_text("Raw profile type exif", "\nexif\n      14\n45786966zz\n")
    png = io.BytesIO()
    pic.save(png, "PNG", pnginfo=info)
    with Image.open(png) as img:
        assert orientation(img) == 1


def test_the_header_gives_the_upright_size_where_asked() -> None:
    data = _kinds(6)["jpeg"]
    assert header_size(data) == (H, W)
    assert header_size(data, upright=True) == (W, H)
    assert header_size(_kinds(3)["png"], upright=True) == (H, W)
    assert header_size(_kinds(6)["png-raw-profile"], upright=True) == (W, H)
    # An eXIf chunk after the pixels: read where the bytes are the whole PNG; from bytes
    # cut short of its end, the upright size is not known (the reader reads it whole).
    late = _kinds(6)["png-exif-after-pixels"]
    assert header_size(late, upright=True, whole=True) == (W, H)
    assert header_size(late[:-40], upright=True) is None
    assert header_size(late[:-40]) == (H, W)
    early = _kinds(6)["png"]  # before the pixels: known from the first bytes
    assert header_size(early[: len(early) // 2], upright=True) == (W, H)


# --- the decode ----------------------------------------------------------------------------


@pytest.mark.parametrize("roi", [True, False], ids=["region", "pillow"])
@pytest.mark.parametrize("o", range(1, 9))
def test_every_decode_path_gives_pillows_upright_pixels(o: int, roi: bool) -> None:
    """Each orientation, each kind (the region decoder for the JPEGs, a DCT-scaled one),
    random crops with flips and a centre crop: ``exif_transpose``'s pixels."""
    transforms: list[al.Transform] = [
        al.RandomResizedCrop(OUT, hflip=True),
        al.Resize(OUT),
        al.RandomResizedCrop(OUT, scale=(0.9, 1.0)),
    ]
    for kind, data in _kinds(o).items():
        with Image.open(io.BytesIO(data)) as img:
            img.load()  # as exif_transpose reads it (a PNG's eXIf may follow the pixels)
            width, height = upright_size(*img.size, orientation(img))
        for transform in transforms:
            spec = DecodeSpec((3, OUT, OUT), transform, roi=roi, exif_orientation=True)
            for seed in range(4):
                out = np.zeros((3, OUT, OUT), np.uint8)
                decode_into(data, out, spec, seed, kind)
                plan = transform.plan(width, height, random.Random(seed))
                want = pillow(data, plan.box, plan.size)
                want = want[:, ::-1] if plan.flip else want
                assert np.array_equal(out, want.transpose(2, 0, 1)), (kind, transform, seed)


@pytest.mark.parametrize("o", [1, 3, 6, 8])
def test_without_the_option_the_pixels_are_as_pillow_decodes_them(o: int) -> None:
    """As stored — except a TIFF, which Pillow itself turns upright as it loads it (and
    whose size it gives upright): the loader plans for what Pillow gives, either way."""
    for kind, data in _kinds(o).items():
        with Image.open(io.BytesIO(data)) as img:
            size = img.size
        if kind != "jpeg-large":  # (a photo of its own size)
            assert size == (upright_size(W, H, o) if kind == "tiff" else (W, H)), kind
        spec = DecodeSpec((3, OUT, OUT), al.Resize(OUT))
        out = np.zeros((3, OUT, OUT), np.uint8)
        decode_into(data, out, spec, 0, kind)
        plan = al.Resize(OUT).plan(*size, random.Random(0))
        want = pillow(data, plan.box, plan.size, upright=False)
        assert np.array_equal(out, want.transpose(2, 0, 1)), kind


@pytest.mark.parametrize("o", range(1, 9))
def test_a_bucket_crops_the_upright_image(o: int) -> None:
    """The bucket and its crop are the upright image's: a portrait photo stored landscape
    (orientations 5-8) goes to the portrait bucket."""
    size = (32, 20) if o >= 5 else (20, 32)  # (bh, bw): the upright image's shape
    buckets = al.Buckets((size,), crop="random", hflip=True)
    data = _kinds(o)["jpeg-large"]
    with Image.open(io.BytesIO(data)) as img:
        width, height = upright_size(*img.size, o)
    spec = DecodeSpec((3, *size), buckets=buckets, exif_orientation=True)
    for seed in range(4):
        out = np.zeros((3, *size), np.uint8)
        decode_into(data, out, spec, seed, "k", mark=(*size, height, width))
        plan, _ = bucket_plan(width, height, size, random.Random(seed), hflip=True)
        want = pillow(data, plan.box, plan.size)
        want = want[:, ::-1] if plan.flip else want
        assert np.array_equal(out, want.transpose(2, 0, 1)), seed
    # Its recorded size must be the upright one: the stored one (another where it swaps
    # width and height) is refused, naming both.
    stored = (height, width) if o < 5 else (width, height)  # (h, w) as stored
    refused = pytest.raises(al.DecodeError, match="recorded")
    with refused if o >= 5 else contextlib.nullcontext():
        decode_into(data, np.zeros((3, *size), np.uint8), spec, 0, "k", mark=(*size, *stored))


def _large_jpeg(o: int) -> bytes:
    """A JPEG over :data:`SCALED_COPY_MIN` (noise keeps it large), tagged ``o``."""
    rng = np.random.default_rng(o)
    arr = rng.integers(0, 256, (900, 1300, 3), dtype=np.uint8)
    data = _tagged(Image.fromarray(arr), "JPEG", o, quality=95)
    assert len(data) >= SCALED_COPY_MIN
    return data


@pytest.mark.parametrize("o", [1, 6])
def test_scaled_copies_keep_the_orientation_and_the_pixels(o: int) -> None:
    data = _large_jpeg(o)
    copies = dict(scaled_copies(data))
    assert copies and all(name.startswith("jpeg2/") for name in copies)
    spec = DecodeSpec((3, OUT, OUT), al.Resize(OUT), exif_orientation=True)
    for copy in copies.values():
        with Image.open(io.BytesIO(copy)) as img:
            assert orientation(img) == o
        assert decode_scale(copy, spec, 0) == decode_scale(data, spec, 0) == 8
    whole, small = np.zeros((3, OUT, OUT), np.uint8), np.zeros((3, OUT, OUT), np.uint8)
    decode_into(data, whole, spec, 0, "k")
    decode_into(copies["jpeg2/8"], small, spec, 0, "k")
    assert np.array_equal(whole, small)


def test_a_decode_hook_with_the_option_is_refused() -> None:
    with pytest.raises(ValueError, match="exif_orientation"):
        al.DecodeConfig(
            hook=lambda b: np.zeros((3, 2, 2), np.uint8),
            sample_shape=(3, 2, 2),
            exif_orientation=True,
        )


# --- through the loader ------------------------------------------------------------------

BUCKETS = al.Buckets(((16, 32), (24, 24), (32, 16)), hflip=True)
PHOTOS = {  # name → orientation; every one stored 97 × 61 (landscape)
    "a.jpg": 1,
    "b.jpg": 6,  # a portrait photo from a phone
    "c.jpg": 8,
    "d.jpg": 3,
    "e.png": 5,
    "f.png": 3,  # its eXIf chunk after the pixels, past the first 64 KiB: the PNG read whole
}


@pytest.fixture(scope="module")
def turned(moto: MotoServer) -> tuple[str, dict[str, bytes]]:
    moto.create_bucket("turned")
    photos = {}
    for i, (name, o) in enumerate(PHOTOS.items()):
        fmt = "PNG" if name.endswith(".png") else "JPEG"
        if name == "f.png":
            photos[name] = late_exif_png(_picture(seed=i), o, padding=80_000)
        else:
            photos[name] = _tagged(_picture(seed=i), fmt, o)
        moto.put("turned", f"p/{name}", photos[name])
    rows = "".join(f'{{"file_name": "{n}", "text": "{n}"}}\n' for n in PHOTOS)
    moto.put("turned", "p/metadata.jsonl", rows.encode())
    return "s3://turned/p/", photos


def _run(url: str, endpoint: str, cache: str, upright: bool) -> tuple[list[Any], al.Stats]:
    with al.ImageLoader(
        url,
        batch_size=1,
        labels=None,
        buckets=BUCKETS,
        extras=("text", "original_size", "crop_top_left", "seed"),
        cache_dir=cache,
        decode=al.DecodeConfig(exif_orientation=upright),
        engine=al.EngineConfig(mode="inline"),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    ) as loader:
        got = [(images[0].numpy(), extras) for images, _, extras in loader]  # type: ignore[misc]
        return got, loader.stats()


def test_a_bucketed_run_of_turned_photos_from_moto(
    moto: MotoServer, turned: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """Each photo in the bucket of its upright shape, its ``original_size`` upright, its
    pixels ``exif_transpose``'s crop; the headers read once per node for each way (the
    next run with the store stopped reads none); without the option, the stored shape."""
    url, photos = turned
    with FaultProxy(moto.endpoint) as proxy:
        got, stats = _run(url, proxy.endpoint, str(tmp_path), upright=True)
        stored, _ = _run(url, proxy.endpoint, str(tmp_path), upright=False)
        gone = proxy.endpoint
    assert stats.skipped == {}
    assert sorted(extras["text"][0] for _, extras in got) == sorted(PHOTOS)
    for pixels, extras in got:
        name = extras["text"][0]
        o = PHOTOS[name]
        height, width = (W, H) if o >= 5 else (H, W)
        assert tuple(extras["original_size"][0]) == (height, width), name
        shape = pixels.shape[1:]
        assert shape == BUCKETS.sizes[int(BUCKETS.nearest([height], [width])[0])], name
        assert (shape[0] > shape[1]) == (o >= 5), name
        top, left = extras["crop_top_left"][0]
        plan, corner = bucket_plan(
            width, height, shape, random.Random(extras["seed"][0]), hflip=True
        )
        assert corner == (top, left)
        want = pillow(photos[name], plan.box, plan.size)
        want = want[:, ::-1] if plan.flip else want
        assert np.array_equal(pixels, want.transpose(2, 0, 1)), name
        # The same from what the batch carries, by the documented reference.
        img, box, _ = bucket_reference(photos[name], shape, (top, left), upright=True)
        ref = np.asarray(img.resize(shape[::-1], Image.Resampling.BILINEAR, box=box))
        assert np.array_equal(pixels, (ref[:, ::-1] if plan.flip else ref).transpose(2, 0, 1))
    for _, extras in stored:
        assert tuple(extras["original_size"][0]) == (H, W)
    # The next runs, either way, with the store stopped: the sizes of each way were kept.
    again, stats = _run(url, gone, str(tmp_path), upright=True)
    assert stats.requests == 0
    assert sorted((e["text"][0], tuple(p.shape)) for p, e in again) == sorted(
        (e["text"][0], tuple(p.shape)) for p, e in got
    )
    again, stats = _run(url, gone, str(tmp_path), upright=False)
    assert stats.requests == 0 and len(again) == len(stored)


def test_gpu_decode_leaves_a_turned_jpeg_to_the_cpu(jpeg_folder: Path) -> None:
    """GPU decode (nvJPEG) does not turn images: an engine that ships JPEGs to the GPU
    decodes a turned one on the CPU instead, upright; an upright one still ships."""
    from asyncloader._base._types import DecodeJob, DecodePath, Outcome
    from asyncloader._decode._ship import Shipper
    from asyncloader._device._ring import BatchRing

    photo = next(iter(sorted(jpeg_folder.rglob("*.jpg")))).read_bytes()
    img = Image.open(io.BytesIO(photo))
    turned, upright = _tagged(img, "JPEG", 6, quality=90), _tagged(img, "JPEG", 1, quality=90)
    spec = DecodeSpec((3, OUT, OUT), al.Resize(OUT), exif_orientation=True)
    ring = BatchRing(2, 2, (3, OUT, OUT), shared=True, arena=2 << 20)
    try:
        assert ring.records is not None and ring.arena is not None
        shipper = Shipper(spec, ring.images, ring.records, ring.arena)
        first = shipper.run(DecodeJob(turned, 0, 0, 5, "turned.jpg"), 0)
        second = shipper.run(DecodeJob(upright, 0, 1, 5, "upright.jpg"), 0)
        assert isinstance(first, Outcome) and first.path is DecodePath.GPU_TO_CPU
        assert isinstance(second, Outcome) and second.path is DecodePath.SHIPPED
        width, height = upright_size(*img.size, 6)
        plan = al.Resize(OUT).plan(width, height, random.Random(5))
        want = pillow(turned, plan.box, plan.size).transpose(2, 0, 1)
        assert np.array_equal(ring.images[0, 0], want)
    finally:
        ring.close()


def test_warm_keeps_the_upright_sizes_too(
    moto: MotoServer, turned: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """After ``warm``, a bucketed run with the option sends no request at all, the store
    stopped: the upright sizes were noted from the bytes warm fetched."""
    url, _ = turned
    with FaultProxy(moto.endpoint) as proxy:
        report = al.warm(url, tmp_path, store_options={"endpoint_url": proxy.endpoint})
        assert report.failed == []
        gone = proxy.endpoint
    # Noted both ways, so that neither run reads a header, even from the node's disk.
    for upright in (False, True):
        kept = _load(sizes_path(tmp_path, url, upright))
        assert sorted(k.rsplit("/", 1)[-1] for k, _ in kept) == sorted(PHOTOS)
        for (key, _), (h, w) in kept.items():
            swapped = upright and PHOTOS[key.rsplit("/", 1)[-1]] >= 5
            assert (h, w) == ((W, H) if swapped else (H, W)), key
    got, stats = _run(url, gone, str(tmp_path), upright=True)
    assert stats.requests == 0 and stats.skipped == {}
    shapes = {e["text"][0]: tuple(p.shape[1:]) for p, e in got}
    assert all((shapes[n][0] > shapes[n][1]) == (o >= 5) for n, o in PHOTOS.items())


def test_a_dataset_counts_its_batches_from_the_upright_sizes(
    moto: MotoServer, turned: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """``len()`` of a bucketed ``ImageDataset`` with the option reads the sizes its loaders
    read: the upright ones (kept apart from the stored ones in the cache folder)."""
    from asyncloader.torch import ImageDataset

    url, _ = turned
    ds = ImageDataset(
        url,
        batch_size=2,
        labels=None,
        buckets=BUCKETS,
        extras=("text",),
        cache_dir=str(tmp_path),
        decode=al.DecodeConfig(exif_orientation=True),
        store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
    )
    try:
        # Upright: three landscape photos and three portrait ones (a batch each, and one
        # left over each); as stored, six landscape ones would make three batches.
        assert len(ds) == 2
    finally:
        ds.close()
    assert sizes_path(tmp_path, url, upright=True).is_file()
    assert not sizes_path(tmp_path, url).exists()


def test_a_bucketed_state_resumes_upright_and_refuses_the_other_way(
    moto: MotoServer, turned: tuple[str, dict[str, bytes]]
) -> None:
    """The option changes a bucketed epoch (some photos change bucket): a state saved with
    it resumes the rest exactly with it, and is refused without it (and the other way)."""
    url, _ = turned

    def loader(upright: bool) -> al.ImageLoader:
        return al.ImageLoader(
            url,
            batch_size=1,
            labels=None,
            seed=4,
            buckets=BUCKETS,
            extras=("text",),
            decode=al.DecodeConfig(exif_orientation=upright),
            engine=al.EngineConfig(mode="inline"),
            store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
        )

    def names(it: Any) -> list[str]:
        return [extras["text"][0] for _, _, extras in it]

    with loader(True) as whole:
        everything = names(whole)
    with loader(True) as first:
        it = iter(first)
        head = names(next(it) for _ in range(2))
        state = first.state_dict()
    assert head == everything[:2] and state["buckets"].endswith(" upright")
    with loader(True) as again:
        again.load_state_dict(state)
        assert names(again) == everything[2:]
    with loader(False) as other:
        with pytest.raises(ValueError, match="buckets"):
            other.load_state_dict(state)
        stored = other.state_dict()
    with loader(True) as other, pytest.raises(ValueError, match="buckets"):
        other.load_state_dict({**stored, "next_batch": 1})


def test_a_png_over_max_pixels_is_refused_before_its_pixels_are_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the option a PNG is loaded before its orientation is read (its eXIf may follow
    the pixels) — but not one over ``max_pixels``: that is refused from its header, as
    every image is, no pixel of it decoded."""

    def decoded(self: Image.Image) -> None:
        raise AssertionError("a pixel was decoded")

    data = late_exif_png(_picture(), 6)
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", decoded)
    spec = DecodeSpec((3, OUT, OUT), al.Resize(OUT), exif_orientation=True, max_pixels=100)
    with pytest.raises(al.DecodeError, match="max_pixels"):
        decode_into(data, np.zeros((3, OUT, OUT), np.uint8), spec, 0, "k")
