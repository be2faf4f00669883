"""Region-of-interest JPEG decoding: the region's pixels are exactly a whole decode's at the
same DCT scale, for every subsampling, progressive and grayscale files, any region; the
sample is exactly the Pillow path's; what the fast path does not take (CMYK, files libjpeg
warns about) goes through Pillow."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._base._errors import DecodeError
from asyncloader._decode._image import ROI_DECODE, DecodeSpec, decode_into

if os.environ.get("ASYNCLOADER_REQUIRE_ROI") == "1":
    assert ROI_DECODE, "the _jpegroi extension was not built (libjpeg-turbo headers?)"
pytestmark = pytest.mark.skipif(not ROI_DECODE, reason="_jpegroi extension not built")


def _jpeg(w: int, h: int, *, seed: int = 0, mode: str = "RGB", **save: object) -> bytes:
    rng = np.random.default_rng(seed)
    # Smooth gradients plus grain: chroma varies across block edges, as in photos.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255) // max(w, 1), (y * 255) // max(h, 1), ((x + y) * 3) % 256], -1)
    arr = np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _whole(data: bytes, scale: int) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    w, h = img.size
    if scale > 1:
        img.draft("RGB", (w // scale, h // scale))
        assert img.size == (-(-w // scale), -(-h // scale))
    return np.asarray(img.convert("RGB"))


def _region(data: bytes, scale: int, box: tuple[int, int, int, int]) -> np.ndarray:
    from asyncloader._decode import _jpegroi  # type: ignore[attr-defined]

    x0, y0, x1, y1 = box
    got = _jpegroi.decode(data, scale, x0, y0, x1, y1)
    assert got is not None
    canvas, left, top, width, height, cw, ch = got
    assert left <= x0 and top == y0 and left + width >= x1 and height == y1 - y0
    arr = np.frombuffer(canvas, np.uint8).reshape(ch, cw, 4)  # RGBX
    return arr[y0:y1, x0:x1, :3]


KINDS = {
    "4:2:0": {"subsampling": 2},
    "4:2:2": {"subsampling": 1},
    "4:4:4": {"subsampling": 0},
    "progressive": {"progressive": True},
    "restart markers": {"subsampling": 2, "restart_marker_blocks": 4},
}


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from([*KINDS, "grayscale"]),
    size=st.tuples(st.integers(1, 300), st.integers(1, 300)),
    scale=st.sampled_from([1, 2, 4, 8]),
    frac=st.tuples(*[st.floats(0, 1)] * 4),
)
def test_a_region_is_exactly_what_a_whole_decode_gives(
    kind: str, size: tuple[int, int], scale: int, frac: tuple[float, float, float, float]
) -> None:
    w, h = size
    scale = scale if min(w, h) >= scale else 1  # draft() can express no smaller image
    save = {"mode": "L"} if kind == "grayscale" else KINDS[kind]
    data = _jpeg(w, h, **save)  # type: ignore[arg-type]
    whole = _whole(data, scale)
    sh, sw = whole.shape[:2]
    xa, xb = sorted(int(f * sw) for f in frac[:2])
    ya, yb = sorted(int(f * sh) for f in frac[2:])
    box = (
        min(xa, sw - 1),
        min(ya, sh - 1),
        max(xb, min(xa, sw - 1) + 1),
        max(yb, min(ya, sh - 1) + 1),
    )
    assert np.array_equal(_region(data, scale, box), whole[box[1] : box[3], box[0] : box[2]])


@pytest.mark.parametrize(
    "transform", [al.RandomResizedCrop(224), al.CenterCrop(224, resize=256), al.Resize(96)]
)
def test_samples_are_the_pillow_paths_exactly(jpeg_folder: Path, transform: al.Transform) -> None:
    datas = [p.read_bytes() for p in sorted(jpeg_folder.rglob("*.jpg"))[:40]]
    datas.append(_jpeg(1600, 1200, seed=3))  # DCT scaling on the way
    h, w = transform.output_size
    fast, slow = np.empty((3, h, w), np.uint8), np.empty((3, h, w), np.uint8)
    spec_fast = DecodeSpec((3, h, w), transform=transform)
    spec_slow = DecodeSpec((3, h, w), transform=transform, roi=False)
    for seed in range(3):
        for i, data in enumerate(datas):
            decode_into(data, fast, spec_fast, seed * 100 + i, f"k{i}")
            decode_into(data, slow, spec_slow, seed * 100 + i, f"k{i}")
            assert np.array_equal(fast, slow), (seed, i)


def test_what_the_fast_path_does_not_take_goes_through_pillow() -> None:
    from asyncloader._decode import _jpegroi  # type: ignore[attr-defined]

    cmyk = _jpeg(64, 48, mode="CMYK")
    assert _jpegroi.decode(cmyk, 1, 0, 0, 64, 48) is None
    # Bytes after the image's end make libjpeg warn: left to Pillow too.
    noisy = _jpeg(64, 48)[:-2] + b"\x00" * 50 + b"\xff\xd9"
    spec = DecodeSpec((3, 32, 32), transform=al.Resize(32))
    for data in (cmyk, noisy):
        fast, slow = np.empty((3, 32, 32), np.uint8), np.empty((3, 32, 32), np.uint8)
        decode_into(data, fast, spec, 0, "k")
        decode_into(data, slow, DecodeSpec((3, 32, 32), transform=al.Resize(32), roi=False), 0, "k")
        assert np.array_equal(fast, slow)


def test_bad_bytes_and_bombs_are_refused_before_pixels() -> None:
    from asyncloader._decode import _jpegroi  # type: ignore[attr-defined]

    good = _jpeg(200, 150)
    spec = DecodeSpec((3, 32, 32), transform=al.RandomResizedCrop(32))
    out = np.empty((3, 32, 32), np.uint8)
    for bad in (good[:300], good[:2] + bytes(random.Random(0).randbytes(500)), b"not a jpeg"):
        with pytest.raises(DecodeError, match="k"):
            decode_into(bad, out, spec, 0, "k")
    with pytest.raises(ValueError, match="outside"):
        _jpegroi.decode(good, 1, 0, 0, 201, 150)
    with pytest.raises(ValueError, match="scale"):
        _jpegroi.decode(good, 3, 0, 0, 10, 10)
    with pytest.raises(DecodeError, match="max_pixels"):
        decode_into(
            good, out, DecodeSpec((3, 32, 32), al.RandomResizedCrop(32), max_pixels=100), 0, "k"
        )
