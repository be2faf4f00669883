"""Every image format a folder holds: PNG (palette, transparency, alpha, 16-bit, grayscale,
1-bit), WebP, BMP, TIFF, GIF (the first frame), PPM, and grayscale, CMYK and progressive
JPEGs come out as RGB pixels equal, bit for bit, to Pillow's decode followed by the same
crop, resize and flip — with every decode path (the region decoder and the fused resize, or
Pillow alone), and through the whole loader from a real S3 server with both CPU decode
backends.

The reference here is Pillow alone: ``Image.open``, for a JPEG ``draft`` at the size the
crop needs (Pillow's own DCT scaling, the documented fast path), ``convert("RGB")``, then
``resize(BILINEAR, box=)`` and a mirror.  One conversion is the loader's stated rule, where
Pillow's own ``convert`` would lose the picture: a 16-bit grayscale image keeps its high byte
(the rule Pillow applies to 16-bit RGB PNGs, checked below) instead of clipping to white.  A
palette with per-entry transparency gives ``convert("RGB")``'s pixels, without its warning
(the suite turns warnings into errors)."""

from __future__ import annotations

import functools
import io
import math
import random
import struct
import warnings
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image

import asyncloader as al
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader._decode._transforms import bucket_plan
from asyncloader.testing import MotoServer

W, H = 97, 83  # odd sizes: no format's block or row alignment hides an error
OUT = 40


def _picture(seed: int = 0) -> np.ndarray:
    """Gradients and grain, so every channel differs across the picture."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W]
    base = np.stack([(x * 255) // W, (y * 255) // H, ((x + y) * 5) % 256], -1)
    return np.clip(base + rng.integers(-30, 31, (H, W, 3)), 0, 255).astype(np.uint8)


def _save(img: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG (gray, gray+alpha, RGB or RGBA by the last axis), written by hand:
    Pillow writes 16-bit only for grayscale."""
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[arr.shape[2]]
    h, w = arr.shape[:2]
    rows = b"".join(b"\x00" + arr[r].astype(">u2").tobytes() for r in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _wide16(seed: int, channels: int) -> np.ndarray:
    """16-bit samples whose high and low bytes both vary."""
    arr = _picture(seed)[:, :, :channels].astype(np.uint16) * 257
    noise = np.random.default_rng(seed).integers(0, 256, arr.shape)
    return (arr ^ noise).astype(np.uint16)


@functools.cache
def zoo() -> dict[str, bytes]:
    """One image of each kind, named with the extension a folder would give it (made
    once: read only)."""
    rgb = Image.fromarray(_picture())
    other = Image.fromarray(_picture(1))
    palette = rgb.quantize(64)
    return {
        "jpeg_baseline.jpg": _save(rgb, "JPEG", quality=90),
        "jpeg_gray.jpg": _save(rgb.convert("L"), "JPEG", quality=90),
        "jpeg_cmyk.jpg": _save(rgb.convert("CMYK"), "JPEG", quality=90),
        "jpeg_progressive.jpeg": _save(rgb, "JPEG", quality=90, progressive=True),
        # Several pictures in one JPEG (MPF: a phone's gain map, a camera's preview).
        "jpeg_mpo.jpg": _save(rgb, "MPO", quality=90, save_all=True, append_images=[other]),
        "png_rgb.png": _save(rgb, "PNG"),
        "png_palette.png": _save(palette, "PNG"),
        "png_palette_alpha.png": _save(palette, "PNG", transparency=bytes(range(0, 256, 4))),
        "png_palette_key.png": _save(palette, "PNG", transparency=5),
        "png_rgba.png": _save(rgb.convert("RGBA"), "PNG"),
        "png_gray_alpha.png": _save(rgb.convert("LA"), "PNG"),
        "png_gray.png": _save(rgb.convert("L"), "PNG"),
        "png_1bit.png": _save(rgb.convert("1"), "PNG"),
        "png_gray16.png": _png16(_wide16(2, 1)),
        "png_rgb16.png": _png16(np.dstack([_wide16(3, 3)])),
        "png_rgba16.png": _png16(np.dstack([_wide16(4, 3), _wide16(5, 1)])),
        "webp_lossy.webp": _save(rgb, "WEBP", quality=90),
        "webp_alpha.webp": _save(rgb.convert("RGBA"), "WEBP", lossless=True),
        "bmp_rgb.bmp": _save(rgb, "BMP"),
        "bmp_palette.bmp": _save(palette, "BMP"),
        "tiff_rgb.tif": _save(rgb, "TIFF"),
        "tiff_cmyk.tiff": _save(rgb.convert("CMYK"), "TIFF"),
        "tiff_gray16.tif": _save(Image.fromarray(_wide16(6, 1)[:, :, 0]), "TIFF"),
        "gif_animated.gif": _save(rgb, "GIF", save_all=True, append_images=[other]),
        "ppm_rgb.ppm": _save(rgb, "PPM"),
    }


def pillow(
    data: bytes, box: tuple[float, float, float, float], size: tuple[int, int]
) -> Image.Image:
    """Pillow's own decode of ``data`` for a crop of ``box`` to ``size``, as RGB."""
    img = Image.open(io.BytesIO(data))
    left, top, right, bottom = box
    if img.format in ("JPEG", "MPO"):  # an MPO's first picture is a JPEG: draft scales it
        width, height = img.size
        want = (
            math.ceil(width * size[0] / max(right - left, 1)),
            math.ceil(height * size[1] / max(bottom - top, 1)),
        )
        img.draft("RGB", want)
        sx, sy = img.size[0] / width, img.size[1] / height
        box = (left * sx, top * sy, right * sx, bottom * sy)
    if img.mode.startswith("I;16"):  # the stated rule: the high byte
        gray = (np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8)
        img = Image.fromarray(gray, "L")
    with warnings.catch_warnings():  # a palette's per-entry transparency: Pillow warns
        warnings.simplefilter("ignore")
        img = img.convert("RGB")
    return img.resize(size, Image.Resampling.BILINEAR, box=box)


def reference(data: bytes, transform: al.Transform, seed: int) -> np.ndarray:
    """The CHW sample Pillow gives for ``data`` with ``transform``'s plan for ``seed``."""
    width, height = Image.open(io.BytesIO(data)).size
    plan = transform.plan(width, height, random.Random(seed))
    arr = np.asarray(pillow(data, plan.box, plan.size))
    if plan.flip:
        arr = arr[:, ::-1]
    return arr.transpose(2, 0, 1)


def test_the_zoo_holds_what_it_names() -> None:
    """Each file is the kind its name says (a zoo of the same kind twice would prove less)."""
    modes = {name: Image.open(io.BytesIO(data)) for name, data in zoo().items()}
    want = {
        "jpeg_gray.jpg": ("JPEG", "L"),
        "jpeg_cmyk.jpg": ("JPEG", "CMYK"),
        "jpeg_mpo.jpg": ("MPO", "RGB"),
        "png_palette.png": ("PNG", "P"),
        "png_palette_alpha.png": ("PNG", "P"),
        "png_rgba.png": ("PNG", "RGBA"),
        "png_gray_alpha.png": ("PNG", "LA"),
        "png_1bit.png": ("PNG", "1"),
        "png_gray16.png": ("PNG", "I;16"),
        "png_rgb16.png": ("PNG", "RGB"),
        "webp_lossy.webp": ("WEBP", "RGB"),
        "bmp_palette.bmp": ("BMP", "P"),
        "tiff_cmyk.tiff": ("TIFF", "CMYK"),
        "tiff_gray16.tif": ("TIFF", "I;16"),
        "gif_animated.gif": ("GIF", "P"),
        "ppm_rgb.ppm": ("PPM", "RGB"),
    }
    for name, (fmt, mode) in want.items():
        assert (modes[name].format, modes[name].mode) == (fmt, mode), name
    assert isinstance(modes["png_palette_alpha.png"].info["transparency"], bytes)
    assert getattr(modes["gif_animated.gif"], "n_frames", 1) == 2
    assert getattr(modes["jpeg_mpo.jpg"], "n_frames", 1) == 2
    assert Image.open(io.BytesIO(zoo()["jpeg_progressive.jpeg"])).info.get("progressive")


def test_sixteen_bits_keep_their_high_byte_as_pillow_does_for_rgb() -> None:
    """The gray rule is Pillow's own rule for 16-bit colour: the high byte of each sample."""
    src = np.dstack([_wide16(3, 3)])
    got = np.asarray(Image.open(io.BytesIO(_png16(src))).convert("RGB"))
    assert np.array_equal(got, (src >> 8).astype(np.uint8))
    gray = _wide16(2, 1)
    # A whole-image plan: a 1:1 resize gives the source's own pixels.
    out = np.empty((3, H, W), np.uint8)
    decode_into(_png16(gray), out, DecodeSpec((3, H, W), transform=_Whole()), 0, "g.png")
    for c in range(3):
        assert np.array_equal(out[c], (gray[:, :, 0] >> 8).astype(np.uint8))


class _Whole:
    """The whole image at its own size, unflipped."""

    @property
    def output_size(self) -> tuple[int, int]:
        return (H, W)

    def plan(self, width: int, height: int, rng: random.Random) -> al.Plan:
        return al.Plan(box=(0, 0, width, height), size=(W, H), flip=False)


TRANSFORMS: dict[str, Callable[[], al.Transform]] = {
    "random crop and flip": lambda: al.RandomResizedCrop(OUT, scale=(0.05, 1.0)),
    "enlarge": lambda: al.RandomResizedCrop(2 * W, scale=(0.5, 1.0)),
    "centre crop": lambda: al.CenterCrop(OUT),
}


@pytest.mark.parametrize("roi", [True, False], ids=["fast paths", "pillow only"])
@pytest.mark.parametrize("name", sorted(zoo()))
def test_each_format_decodes_to_pillows_pixels(name: str, roi: bool) -> None:
    data = zoo()[name]
    for what, make in TRANSFORMS.items():
        transform = make()
        h, w = transform.output_size
        spec = DecodeSpec((3, h, w), transform=transform, roi=roi)
        for seed in range(6):
            out = np.empty((3, h, w), np.uint8)
            decode_into(data, out, spec, seed, name)
            want = reference(data, transform, seed)
            assert np.array_equal(out, want), f"{name}, {what}, seed {seed}"


@pytest.fixture(scope="module")
def zoo_dataset(moto: MotoServer) -> str:
    moto.create_bucket("zoo")
    for name, data in zoo().items():
        moto.put("zoo", f"all/kinds/{name}", data)
    return "s3://zoo/all/"


@pytest.mark.parametrize("engines", [1, 2])
def test_a_folder_of_every_format_through_the_loader(
    moto: MotoServer, zoo_dataset: str, engines: int, tmp_path: object
) -> None:
    """Listed by extension (GIF and PPM among them), fetched from S3, decoded by one engine
    or two: every sample is Pillow's."""
    names = sorted(zoo())
    index = {f"kinds/{n}": i for i, n in enumerate(names)}
    transform = al.CenterCrop(OUT)
    with al.ImageLoader(
        zoo_dataset,
        batch_size=5,
        transform=transform,
        labels=index.__getitem__,
        engine=al.EngineConfig(processes=engines),
        cache_dir=str(tmp_path),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
    ) as loader:
        assert loader.num_samples == len(names)
        seen = []
        for images, labels in loader:
            for image, label in zip(images.numpy(), labels.tolist(), strict=True):
                name = names[label]
                want = reference(zoo()[name], transform, 0)
                assert np.array_equal(image, want), name
                seen.append(name)
        assert loader.stats().skipped == {}
    assert sorted(seen) == names


def test_every_format_in_aspect_ratio_buckets_is_pillows_resize_of_its_crop(
    moto: MotoServer, zoo_dataset: str
) -> None:
    """Bucketed: each format's size read from its header (no width/height anywhere), the
    image to the bucket nearest its shape, its random crop (flipped or not) Pillow's
    BILINEAR resize of the same box — JPEGs at the DCT scale Pillow's draft picks."""
    names = sorted(zoo())
    index = {f"kinds/{n}": i for i, n in enumerate(names)}
    buckets = al.Buckets(((16, 32), (24, 24), (32, 16)), hflip=True)
    with al.ImageLoader(
        zoo_dataset,
        batch_size=1,
        buckets=buckets,
        labels=index.__getitem__,
        extras=("seed", "original_size"),
        engine=al.EngineConfig(mode="inline"),
        store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
    ) as loader:
        seen = []
        for images, labels, extras in loader:
            name, seed = names[int(labels[0])], extras["seed"][0]
            data = zoo()[name]
            width, height = Image.open(io.BytesIO(data)).size
            assert tuple(extras["original_size"][0]) == (height, width), name
            shape = tuple(images.shape[2:])
            assert shape == buckets.sizes[int(buckets.nearest([height], [width])[0])], name
            plan, _ = bucket_plan(width, height, shape, random.Random(seed), hflip=True)
            want = np.asarray(pillow(data, plan.box, plan.size))
            want = (want[:, ::-1] if plan.flip else want).transpose(2, 0, 1)
            assert np.array_equal(images[0].numpy(), want), name
            seen.append(name)
        assert loader.stats().skipped == {}
    assert sorted(seen) == names
