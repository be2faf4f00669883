"""Pixels: an image's bytes decoded, cropped, resized and flipped into a ring slot's sample.

The transform plans the crop from the image's size alone; JPEGs are decoded at 1/2, 1/4 or
1/8 scale (libjpeg's ``draft``) when the crop is at least twice the output.  A ``decode=``
hook replaces all of it for other blobs.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from PIL import Image

from .._errors import DecodeError, shown_key
from .._transforms import Transform
from .._types import Blob, BlobCache, DecodeFn

__all__ = ["DecodeSpec", "U8Array", "decode_into"]

U8Array = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """What every decode needs besides the bytes; sent to each worker once.

    Attributes:
        sample_shape: (C, H, W) of one output sample.
        transform: Geometry planner, or None with a ``decode_fn``.
        decode_fn: A hook turning bytes into a uint8 array of ``sample_shape``.
        max_pixels: Refuse sources with more pixels (decompression bombs).
        cache: The SSD cache workers read hits from and store fetched bytes into.
    """

    sample_shape: tuple[int, int, int]
    transform: Transform | None = None
    decode_fn: DecodeFn | None = None
    max_pixels: int = 89_478_485
    cache: BlobCache | None = None


def decode_into(data: Blob, out: U8Array, spec: DecodeSpec, seed: int, key: str) -> None:
    """Decode ``data`` into ``out`` (a CHW uint8 view of a batch slot).

    Raises:
        DecodeError: corrupt or truncated data, a decompression bomb, a hook that returned
            the wrong shape; the message names ``key``.
    """
    if spec.decode_fn is not None:
        what = shown_key(key)
        try:
            arr = np.asarray(spec.decode_fn(data))
        except Exception as exc:
            raise DecodeError(f"decode hook failed on {what}: {exc!r}", key=key) from exc
        if arr.shape != out.shape or arr.dtype != np.uint8:
            raise DecodeError(
                f"decode hook returned {arr.dtype}{list(arr.shape)} for {what}, "
                f"expected uint8{list(out.shape)}",
                key=key,
            )
        out[...] = arr
        return
    assert spec.transform is not None
    try:
        img: Image.Image = Image.open(io.BytesIO(data))
        width, height = img.size
        if width * height > spec.max_pixels:
            raise DecodeError(
                f"{shown_key(key)} is {width}x{height} pixels, over "
                f"max_pixels={spec.max_pixels} "
                "(decompression bomb?)",
                key=key,
            )
        plan = spec.transform.plan(width, height, random.Random(seed))
        left, top, right, bottom = plan.box
        out_w, out_h = plan.size
        if img.format == "JPEG":
            # Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the crop is at least twice
            # the output: it skips most of the IDCT work.  draft() picks the largest scale
            # that keeps the crop at least as large as the output.
            want = (
                math.ceil(width * out_w / max(right - left, 1)),
                math.ceil(height * out_h / max(bottom - top, 1)),
            )
            if want[0] * 2 <= width and want[1] * 2 <= height:
                img.draft("RGB", want)
                sx, sy = img.size[0] / width, img.size[1] / height
                left, top, right, bottom = left * sx, top * sy, right * sx, bottom * sy
        if img.mode != "RGB":
            img = img.convert("RGB")
        img = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=(left, top, right, bottom))
        arr = np.asarray(img)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(
            f"cannot decode {shown_key(key)}: {type(exc).__name__}: {exc}", key=key
        ) from exc
    if plan.flip:
        arr = arr[:, ::-1]
    # One strided copy HWC → CHW into shared memory; numpy releases the GIL for it.
    np.copyto(out, arr.transpose(2, 0, 1))
