"""A bucketed sample's pixels by Pillow alone, as docs/data.md defines them ("The geometry,
exactly"): a reference to check a loader's bucketed samples against, written from what a
batch carries (``original_size``, ``crop_top_left``, the bucket) and nothing of the
loader's own code."""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageOps

__all__ = ["bucket_reference"]


def bucket_reference(
    data: bytes, bucket: tuple[int, int], corner: tuple[int, int], upright: bool = False
) -> tuple[Image.Image, tuple[float, float, float, float], tuple[int, int]]:
    """For the image ``data`` in the bucket ``(bh, bw)`` cropped at ``corner``
    (``crop_top_left``, ``(top, left)``): the decoded image (RGB; a JPEG at least twice
    the resized size at 1/2, 1/4 or 1/8 scale, as Pillow's ``draft`` decodes it), the
    crop's box in that image's pixels, and the resized size ``(rw, rh)`` the crop is
    taken from.  The sample is ``image.resize((bw, bh), Image.BILINEAR, box=box)``.
    ``upright``: a run with ``DecodeConfig(exif_orientation=True)``, whose image is
    ``ImageOps.exif_transpose``'s."""
    bh, bw = bucket
    top, left = corner
    with Image.open(io.BytesIO(data)) as probe:  # as exif_transpose reads it: loaded
        probe.load()
        o = int(probe.getexif().get(0x0112, 1)) if upright else 1
        turns = o in (5, 6, 7, 8)
        width, height = probe.size[::-1] if turns else probe.size
    with Image.open(io.BytesIO(data)) as img:
        s = max(bw / width, bh / height)
        rw, rh = max(bw, round(width * s)), max(bh, round(height * s))
        sx, sy = width / rw, height / rh
        box = (left * sx, top * sy, (left + bw) * sx, (top + bh) * sy)
        want = (
            math.ceil(width * bw / (box[2] - box[0])),
            math.ceil(height * bh / (box[3] - box[1])),
        )
        if want[0] * 2 <= width and want[1] * 2 <= height:
            img.draft("RGB", want[::-1] if turns else want)  # the stored image's axes
        turned = ImageOps.exif_transpose(img) if upright else img
        fx, fy = turned.size[0] / width, turned.size[1] / height
        rgb = _rgb(turned)
    return rgb, (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy), (rw, rh)


def _rgb(img: Image.Image) -> Image.Image:
    """``img`` as RGB, as docs/data.md's table of image kinds says: Pillow's ``convert``,
    but a 16-bit grayscale image by the high byte of each sample (where ``convert`` would
    clip every value above 255 to white)."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        high = np.right_shift(np.asarray(img, dtype=np.uint16), 8).astype(np.uint8)
        return Image.fromarray(high).convert("RGB")
    return img.convert("RGB")
