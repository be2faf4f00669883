"""Transforms plan the geometry from the source size alone; the decoder follows the plan,
using libjpeg's reduced-scale decode (``draft``) when the crop is at least twice the output."""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, JpegImagePlugin

import asyncloader as al
from asyncloader._decode import DecodeSpec, decode_into

sizes = st.integers(min_value=1, max_value=5000)


@settings(max_examples=300, deadline=None)
@given(width=sizes, height=sizes, seed=st.integers(0, 2**32), out=st.integers(1, 512))
def test_random_resized_crop_plans_stay_inside_and_follow_the_ranges(
    width: int, height: int, seed: int, out: int
) -> None:
    t = al.RandomResizedCrop(out)
    plan = t.plan(width, height, random.Random(seed))
    left, top, right, bottom = plan.box
    assert 0 <= left < right <= width and 0 <= top < bottom <= height
    assert plan.size == (out, out)
    assert plan == t.plan(width, height, random.Random(seed))  # a function of the stream
    w, h = right - left, bottom - top
    area = w * h / (width * height)
    if area <= t.scale[1] and not (w == width or h == height):
        # A sampled box (the fallback is full width or height): its area and aspect come
        # from the ranges, up to the rounding to whole pixels.
        assert t.scale[0] * 0.5 <= area * (1 + 2 / min(w, h)) ** 2
        aspect = w / h
        slack = (1 + 1 / min(w, h)) ** 2
        assert t.ratio[0] / slack <= aspect <= t.ratio[1] * slack


@settings(max_examples=300, deadline=None)
@given(width=sizes, height=sizes, out_h=st.integers(1, 512), out_w=st.integers(1, 512))
def test_resize_plans_the_centred_box_that_maps_onto_the_output(
    width: int, height: int, out_h: int, out_w: int
) -> None:
    t = al.CenterCrop((out_h, out_w))
    assert t.resize == round(min(out_h, out_w) / 0.875)
    plan = t.plan(width, height, random.Random(0))
    left, top, right, bottom = plan.box
    assert plan.size == (out_w, out_h) and not plan.flip
    assert math.isclose(left, width - right, abs_tol=1e-9)
    assert math.isclose(top, height - bottom, abs_tol=1e-9)
    assert 0 <= left < right <= width and 0 <= top < bottom <= height
    scale = t.resize / min(width, height)
    # Not clipped by the source: the box is exactly the output seen at the resize scale.
    if out_w / scale <= width:
        assert math.isclose(right - left, out_w / scale)
    if out_h / scale <= height:
        assert math.isclose(bottom - top, out_h / scale)


def _jpeg(width: int, height: int) -> bytes:
    # A smooth picture: a reduced-scale decode is close to a full one on it.
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack(
        [x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], axis=-1
    ).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def _reference(data: bytes, plan: al.Plan) -> np.ndarray:
    """Full decode, then the plan's crop + resize and flip, then CHW."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    out = np.asarray(img.resize(plan.size, Image.Resampling.BILINEAR, box=plan.box))
    if plan.flip:
        out = out[:, ::-1]
    return out.transpose(2, 0, 1)


@pytest.mark.parametrize(
    ("source", "transform", "drafted"),
    [
        ((1600, 1200), al.CenterCrop(64), True),  # crop ≫ output: a 1/8-scale decode
        ((1600, 1200), al.RandomResizedCrop(96, scale=(0.5, 1.0)), True),
        ((160, 120), al.CenterCrop(96), False),  # crop < 2 × output: full scale
    ],
)
def test_draft_decode_matches_the_full_decode(
    source: tuple[int, int],
    transform: al.Transform,
    drafted: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _jpeg(*source)
    calls: list[tuple[str, tuple[int, int]]] = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def spy(self: JpegImagePlugin.JpegImageFile, mode: str, size: tuple[int, int]) -> object:
        calls.append((mode, size))
        return draft(self, mode, size)

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    h, w = transform.output_size
    spec = DecodeSpec((3, h, w), transform, roi=False)  # the Pillow path (tests/test_roi_decode)
    for seed in range(4):
        out = np.empty((3, h, w), np.uint8)
        decode_into(data, out, spec, seed, "k.jpg")
        plan = transform.plan(*source, random.Random(seed))
        diff = np.abs(out.astype(int) - _reference(data, plan).astype(int))
        # Stated tolerance of the reduced-scale path on a smooth image.
        assert diff.mean() < 2.0 and diff.max() <= 24, (diff.mean(), diff.max())
        if not drafted:
            assert diff.max() == 0  # the full-scale path is the reference itself
    assert bool(calls) == drafted
    for _, size in calls:
        # The scale keeps the crop at least as large as the output.
        assert size[0] >= 1 and size[1] >= 1


@dataclass(frozen=True)
class _Fixed:
    """A transform that always plans the same."""

    fixed: al.Plan

    @property
    def output_size(self) -> tuple[int, int]:
        return self.fixed.size[1], self.fixed.size[0]

    def plan(self, width: int, height: int, rng: random.Random) -> al.Plan:
        return self.fixed


@pytest.mark.parametrize("box", [(10.0, 20.0, 390.0, 280.0), (100.5, 50.25, 160.0, 110.0)])
def test_flip_mirrors_the_same_crop(box: tuple[float, float, float, float]) -> None:
    data = _jpeg(400, 300)
    outs = []
    for flip in (False, True):
        out = np.empty((3, 24, 32), np.uint8)
        decode_into(
            data, out, DecodeSpec((3, 24, 32), _Fixed(al.Plan(box, (32, 24), flip))), 0, "k"
        )
        outs.append(out)
    assert np.array_equal(outs[1], outs[0][:, :, ::-1])


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
@pytest.mark.parametrize("roi", [True, False])
def test_max_pixels_decides_even_above_pillows_own_limit(
    fmt: str, roi: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image over twice Pillow's ``MAX_IMAGE_PIXELS`` (a global of the process, which
    decode processes do not share; Pillow refuses such images) decodes when it is within
    ``max_pixels``, the same pixels as under Pillow's default; over ``max_pixels`` it is
    refused by that name."""
    buf = io.BytesIO()
    rgb = np.random.default_rng(0).integers(0, 256, (60, 80, 3), np.uint8)
    Image.fromarray(rgb).save(buf, fmt)
    data = buf.getvalue()
    transform = al.RandomResizedCrop(32)
    expected = np.empty((3, 32, 32), np.uint8)
    decode_into(data, expected, DecodeSpec((3, 32, 32), transform, roi=roi), 7, "k")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 60 × 80 is over twice it: an error
    out = np.empty((3, 32, 32), np.uint8)
    spec = DecodeSpec((3, 32, 32), transform, max_pixels=60 * 80, roi=roi)
    decode_into(data, out, spec, 7, "k")
    assert np.array_equal(out, expected)
    with pytest.raises(al.DecodeError, match="max_pixels"):
        decode_into(data, out, DecodeSpec((3, 32, 32), transform, max_pixels=60 * 80 - 1), 7, "k")
