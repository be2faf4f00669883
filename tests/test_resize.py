"""The ``_resize`` extension is Pillow's BILINEAR box resize bit for bit: every size, box,
channel layout, flip and pass order, with its vector kernels and without; the decode path
gives the whole-image Pillow path's samples for what Pillow decodes too (PNG, grayscale,
CMYK JPEG)."""

from __future__ import annotations

import ctypes
import io
import itertools
import mmap
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._decode._image import (
    _PILLOW_VERTICAL_FIRST,
    FAST_RESIZE,
    DecodeSpec,
    decode_into,
)

if os.environ.get("ASYNCLOADER_REQUIRE_ROI") == "1":  # a C compiler is there: both build
    assert FAST_RESIZE, "the _resize extension was not built"
pytestmark = pytest.mark.skipif(not FAST_RESIZE, reason="_resize extension not built")


def _pillow(
    arr: np.ndarray, box: tuple[float, ...], size: tuple[int, int], flip: bool
) -> np.ndarray:
    h, w, c = arr.shape
    mode = "RGBX" if c == 4 else "RGB"
    img = Image.frombuffer(mode, (w, h), arr.tobytes(), "raw", mode, 0, 1)
    got = np.asarray(img.resize(size, Image.Resampling.BILINEAR, box=box))[:, :, :3]
    return (got[:, ::-1] if flip else got).transpose(2, 0, 1)


def _ours(
    arr: np.ndarray, box: tuple[float, ...], size: tuple[int, int], flip: bool, simd: int
) -> np.ndarray:
    from asyncloader._decode import _resize  # type: ignore[attr-defined]

    h, w, c = arr.shape
    ow, oh = size
    vertical_first = _PILLOW_VERTICAL_FIRST and h > oh and h - oh > (w - ow) * 2
    out = np.full((3, oh, ow), 7, np.uint8)
    _resize.resize_into(arr, w, h, c, box, out, ow, oh, flip, vertical_first, simd)
    return out


def _kernels() -> range:
    from asyncloader._decode import _resize  # type: ignore[attr-defined]

    return range(int(_resize.SIMD) + 1)


_KERNELS = _kernels() if FAST_RESIZE else range(1)
"""The horizontal pass's kernels this CPU runs: 0 scalar, 1 SSE4.1 (NEON on AArch64), 2 AVX2
(see the C)."""


@st.composite
def _cases(draw: st.DrawFn) -> tuple[np.ndarray, tuple[float, ...], tuple[int, int], bool]:
    w, h = draw(st.integers(1, 160)), draw(st.integers(1, 160))
    channels = draw(st.sampled_from([3, 4]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):  # grain: every weight shows
        arr = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    else:  # a smooth photo-like gradient with edges
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x * y) % 256, x % 7], -1)[:, :, :channels]
        arr = np.ascontiguousarray(base.astype(np.uint8))
    shape = draw(st.sampled_from(["float", "whole", "integer"]))
    if shape == "whole":
        box: tuple[float, ...] = (0, 0, w, h)
    else:
        fx = sorted(draw(st.lists(st.floats(0, 1), min_size=2, max_size=2)))
        fy = sorted(draw(st.lists(st.floats(0, 1), min_size=2, max_size=2)))
        left, right, top, bottom = fx[0] * w, fx[1] * w, fy[0] * h, fy[1] * h
        if shape == "integer":
            left, top = float(int(left)), float(int(top))
        box = (left, top, right, bottom)  # may be empty: Pillow takes that too
    size = (draw(st.integers(1, 200)), draw(st.integers(1, 200)))
    return arr, box, size, draw(st.booleans())


@settings(max_examples=400, deadline=None)
@given(case=_cases())
def test_the_resize_is_pillows_bit_for_bit(
    case: tuple[np.ndarray, tuple[float, ...], tuple[int, int], bool],
) -> None:
    arr, box, size, flip = case
    want = _pillow(arr, box, size, flip)
    for simd in _KERNELS:
        assert np.array_equal(_ours(arr, box, size, flip, simd), want), simd


def test_both_pass_orders_are_met() -> None:
    # Height shrinking much more than width (Pillow 13 runs the vertical pass first), and
    # the other way: both equal Pillow, and they differ from each other in a pixel or more.
    from asyncloader._decode import _resize  # type: ignore[attr-defined]

    arr = np.random.default_rng(1).integers(0, 256, (80, 37, 4), dtype=np.uint8)
    box, size = (0.0, 0.0, 37.0, 80.0), (55, 23)
    for simd in _KERNELS:
        assert np.array_equal(_ours(arr, box, size, False, simd), _pillow(arr, box, size, False))
    h_first, v_first = np.empty((3, 23, 55), np.uint8), np.empty((3, 23, 55), np.uint8)
    _resize.resize_into(arr, 37, 80, 4, box, h_first, 55, 23, False, False)
    _resize.resize_into(arr, 37, 80, 4, box, v_first, 55, 23, False, True)
    assert not np.array_equal(h_first, v_first)


def test_a_box_of_the_output_size_is_a_crop() -> None:
    # Pillow copies such a box instead of resampling it; the weights give the same pixels.
    arr = np.random.default_rng(2).integers(0, 256, (40, 50, 4), dtype=np.uint8)
    for box in ((0.0, 0.0, 50.0, 40.0), (3.0, 5.0, 33.0, 40.0), (20.0, 0.0, 50.0, 30.0)):
        size = (int(box[2] - box[0]), int(box[3] - box[1]))
        for flip in (False, True):
            want = _pillow(arr, box, size, flip)
            crop = arr[int(box[1]) : int(box[3]), int(box[0]) : int(box[2]), :3]
            assert np.array_equal(want, (crop[:, ::-1] if flip else crop).transpose(2, 0, 1))
            for simd in _KERNELS:
                assert np.array_equal(_ours(arr, box, size, flip, simd), want)


@pytest.mark.parametrize("channels", [3, 4])
def test_each_kernel_meets_pillow_at_every_remainder_of_rows_and_columns(channels: int) -> None:
    # The AVX2 horizontal pass takes four rows and four output pixels at a time, its
    # vertical pass 16 bytes of a row: 4-7 source rows and 4-7, 16-19 and 35 output columns
    # leave every remainder, in both pass orders, mirrored or not, with weights that reach
    # the image's last pixel (the last row's last bytes).
    rng = np.random.default_rng(channels)
    for h in range(4, 8):
        for ow in (4, 5, 6, 7, 16, 17, 18, 19, 35):
            arr = rng.integers(0, 256, (h, 9, channels), dtype=np.uint8)
            for size in ((ow, h), (ow, 2), (ow, h + 3)):
                for flip in (False, True):
                    want = _pillow(arr, (0.0, 0.0, 9.0, float(h)), size, flip)
                    for simd in _KERNELS:
                        got = _ours(arr, (0.0, 0.0, 9.0, float(h)), size, flip, simd)
                        assert np.array_equal(got, want), (h, ow, size, flip, simd)


@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through ctypes: Linux")
def test_no_kernel_reads_past_the_image_s_last_byte() -> None:
    # Each image ends where an unreadable page begins: a kernel that read a byte past its
    # last pixel (a vector load of two taps where one is left, 16 bytes of a row where
    # fewer are) would kill this process.  Every size, order, flip and kernel meets Pillow.
    page = mmap.PAGESIZE
    guarded = mmap.mmap(-1, 4 * page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(guarded))
    assert libc.mprotect(base + 3 * page, page, 0) == 0, ctypes.get_errno()
    rng = np.random.default_rng(3)
    for channels, (w, h) in itertools.product((3, 4), [(9, 5), (33, 17), (101, 7), (5, 40)]):
        nbytes = w * h * channels
        arr = np.frombuffer(guarded, np.uint8, nbytes, 3 * page - nbytes).reshape(h, w, channels)
        arr[...] = rng.integers(0, 256, arr.shape, dtype=np.uint8)
        box = (0.0, 0.0, float(w), float(h))
        sizes = [(w, h), (w * 2 + 1, h), (max(w // 3, 1), max(h // 2, 1)), (7, 4), (4, h + 5)]
        for size, flip in itertools.product(sizes, (False, True)):
            want = _pillow(arr, box, size, flip)
            for simd in _KERNELS:
                assert np.array_equal(_ours(arr, box, size, flip, simd), want)


def test_bad_arguments_are_refused() -> None:
    from asyncloader._decode import _resize  # type: ignore[attr-defined]

    src = np.zeros((10, 10, 4), np.uint8)
    out = np.empty((3, 5, 5), np.uint8)
    for box in (
        (-1, 0, 5, 5),
        (0, 0, 11, 5),
        (3, 3, 2, 5),
        (0, 0, 5, 10.5),
        (0, float("nan"), 5, 5),
    ):
        with pytest.raises(ValueError, match="box"):
            _resize.resize_into(src, 10, 10, 4, box, out, 5, 5, False, False)
    with pytest.raises(ValueError, match="out"):
        _resize.resize_into(src, 10, 10, 4, (0, 0, 10, 10), out, 6, 5, False, False)
    with pytest.raises(ValueError, match="smaller"):
        _resize.resize_into(src, 10, 11, 4, (0, 0, 10, 10), out, 5, 5, False, False)
    with pytest.raises(ValueError, match="channels"):
        _resize.resize_into(src, 10, 10, 2, (0, 0, 10, 10), out, 5, 5, False, False)
    for simd in (-1, _resize.SIMD + 1):  # a kernel this CPU does not run
        with pytest.raises(ValueError, match="simd"):
            _resize.resize_into(src, 10, 10, 4, (0, 0, 10, 10), out, 5, 5, False, False, simd)
    with pytest.raises(TypeError):  # read-only output
        _resize.resize_into(src, 10, 10, 4, (0, 0, 10, 10), bytes(75), 5, 5, False, False)


def _encoded(fmt: str, mode: str, size: tuple[int, int] = (150, 110)) -> bytes:
    rng = np.random.default_rng(5)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [
        ("PNG", "RGB"),
        ("PNG", "L"),
        ("PNG", "RGBA"),
        ("PNG", "P"),
        ("JPEG", "CMYK"),
        ("WEBP", "RGB"),
    ],
)
def test_what_pillow_decodes_is_resized_to_the_same_sample(fmt: str, mode: str) -> None:
    data = _encoded(fmt, mode)
    for transform in (al.RandomResizedCrop(64), al.CenterCrop(64, resize=80), al.Resize(48)):
        h, w = transform.output_size
        fast, slow = np.empty((3, h, w), np.uint8), np.empty((3, h, w), np.uint8)
        for seed in range(6):
            decode_into(data, fast, DecodeSpec((3, h, w), transform=transform), seed, "k")
            decode_into(
                data, slow, DecodeSpec((3, h, w), transform=transform, roi=False), seed, "k"
            )
            assert np.array_equal(fast, slow), (transform, seed)


def test_a_sample_that_is_not_contiguous_is_still_filled() -> None:
    data = _encoded("JPEG", "RGB")
    spec = DecodeSpec((3, 32, 32), transform=al.Resize(32))
    batch = np.zeros((2, 3, 32, 64), np.uint8)
    view = batch[0, :, :, ::2]  # every other column: not C-contiguous
    decode_into(data, view, spec, 0, "k")
    want = np.empty((3, 32, 32), np.uint8)
    decode_into(data, want, DecodeSpec((3, 32, 32), transform=al.Resize(32), roi=False), 0, "k")
    assert np.array_equal(view, want)
