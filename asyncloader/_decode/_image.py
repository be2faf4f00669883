"""Pixels: an image's bytes decoded, cropped, resized and flipped into a ring slot's sample.

The transform plans the crop from the image's size alone (Pillow reads the header only);
JPEGs are decoded at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, Pillow's ``draft`` rule)
when the crop is at least twice the output.  With the ``_jpegroi`` extension (built with the
package where libjpeg-turbo's headers are), a JPEG in YCbCr, RGB or grayscale is decoded only
where the crop needs it — its rows, its iMCU columns, plus the resize filter's reach — and
the resize reads only that region: exactly the pixels of a whole decode at the same scale,
then the same crop and resize (tested).  Everything else is decoded by Pillow, whatever the
format (PNG, WebP, BMP, TIFF, GIF's first frame, PPM) and mode, and made RGB by
:func:`to_rgb`: Pillow's conversion, 16-bit gray by its high byte.  With the
``_resize`` extension, the resize, the flip and the copy into the sample are one pass that
gives Pillow's resize bit for bit (tested).  ``DecodeSpec(roi=False)`` keeps today's
all-Pillow path.  A ``decode=`` hook replaces all of it for other blobs.

With ``exif_orientation`` (:mod:`asyncloader._base._orientation`) the crop is planned for the
image turned upright by its EXIF orientation; a JPEG is decoded by region in its stored axes
(the region that holds the crop) and that region turned into an upright canvas, anything
else turned by Pillow's ``transpose``: ``ImageOps.exif_transpose``'s pixels, then the same
crop and resize (tested).

*Scaled copies* (:func:`scaled_copies`, kept in the SSD cache beside large JPEGs with
``cache_scaled_jpegs``): for 1/4 and 1/8 scale, the same JPEG with the DCT coefficients that
libjpeg's reduced inverse DCT never reads at that scale set to zero.  Decoded at that scale,
a copy gives the original's pixels exactly (tested), from a fraction of the entropy-coded
data: a 12-megapixel photo's 1/8 copy is ~8 % of its bytes.  :func:`decode_scale` tells
which copy a sample's crop can use.  A copy keeps the original's EXIF orientation (an APP1
segment of that tag alone).
"""

from __future__ import annotations

import inspect
import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import PIL
from PIL import Image, UnidentifiedImageError

from .._base._buckets import Buckets
from .._base._config import MAX_PIXELS
from .._base._errors import DecodeError, shown_key
from .._base._orientation import (
    TRANSPOSE,
    exif_segment,
    jpeg_orientation,
    orientation,
    stored_box,
    upright_array,
    upright_size,
)
from .._base._types import Blob, BlobCache, DecodeFn
from ._transforms import Plan, Transform, bucket_plan

try:
    from . import _jpegroi  # type: ignore[attr-defined]
except ImportError:  # built without libjpeg-turbo's headers: Pillow decodes everything
    _jpegroi = None
try:
    from . import _resize  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: Pillow resizes
    _resize = None

__all__ = [
    "FAST_RESIZE",
    "MAX_PIXELS",
    "ROI_DECODE",
    "SCALED_COPY_MIN",
    "DecodeSpec",
    "U8Array",
    "decode_into",
    "decode_scale",
    "scaled_copies",
    "scaled_footprint",
    "scaled_name",
    "to_rgb",
]

ROI_DECODE = _jpegroi is not None
"""Whether JPEGs can be decoded by region here (the ``_jpegroi`` extension is built)."""
FAST_RESIZE = _resize is not None
"""Whether the resize goes straight into the sample (the ``_resize`` extension is built)."""

# Pillow 13 runs the vertical pass of a resize first when the height shrinks more than
# twice as much as the width; earlier releases always run the horizontal pass first.  The
# passes round to 8 bits in between, so the order shows in the pixels: ``_resize`` follows
# the installed Pillow.
_PILLOW_VERTICAL_FIRST = int(PIL.__version__.split(".")[0]) >= 13

U8Array = npt.NDArray[np.uint8]

_JPEGS = ("JPEG", "MPO")
"""Pillow's names of a JPEG: ``MPO`` for one holding several pictures (MPF: a phone's HDR
gain map, a camera's preview), whose first picture, the image, is a JPEG stream from the
file's first byte: decoded by region and at DCT scale as any JPEG."""


SCALED_COPY_MIN = 2**20
"""Objects of at least this many bytes get scaled copies (``cache_scaled_jpegs``) [bytes]:
photos of several megapixels, whose crops are mostly decoded at 1/4 or 1/8."""
_SCALED = (4, 8)  # the scales copies are made for (1/2 keeps most of the coefficients)
SCALED_COPY_SHARE = 0.7
"""The copies' bytes as a share of the object's, at most as measured (12 MP photos: the
1/4 copy 57 %, the 1/8 copy 8 %): what a cache too small for the data budgets for them."""


def scaled_footprint(size: int) -> int:
    """The cache bytes an object of ``size`` bytes takes with its scaled copies (an upper
    estimate: objects below :data:`SCALED_COPY_MIN` get none)."""
    return size + int(size * SCALED_COPY_SHARE) if size >= SCALED_COPY_MIN else size


@dataclass(frozen=True, slots=True)
class DecodeSpec:
    """What every decode needs besides the bytes; sent to each worker once.

    Attributes:
        sample_shape: (C, H, W) of one output sample.
        transform: Geometry planner, or None with a ``decode_fn``.
        decode_fn: A hook turning bytes into a uint8 array of ``sample_shape``.
        max_pixels: Refuse sources with more pixels (decompression bombs).
        cache: The SSD cache workers read hits from.
        roi: Decode JPEGs by region where the extension is built (False: whole, by Pillow).
        scaled_copies: Read a large JPEG's hit from its scaled copy in the cache where the
            crop's DCT scale has one (:func:`scaled_copies`).
        hook_seed: ``decode_fn`` takes the sample's seed (``decode_fn(data, seed=...)``:
            :func:`takes_seed`).
        buckets: A bucketed run's buckets (how each crop is drawn), else None.
        exif_orientation: Turn each image upright by its EXIF orientation before the crop
            (:mod:`asyncloader._base._orientation`): the crop is planned, and a bucket
            chosen, for the upright image.
    """

    sample_shape: tuple[int, int, int]
    transform: Transform | None = None
    decode_fn: DecodeFn | None = None
    max_pixels: int = MAX_PIXELS
    cache: BlobCache | None = None
    roi: bool = True
    scaled_copies: bool = False
    hook_seed: bool = False
    buckets: Buckets | None = None
    exif_orientation: bool = False


def takes_seed(fn: Callable[..., Any] | None) -> bool:
    """Whether the decode hook ``fn`` takes a ``seed`` keyword (a parameter of that name,
    or ``**kwargs``): then it gets each sample's seed, the one the built-in transforms
    draw from — made from the loader's seed, the epoch and the sample's place in the epoch's
    order, the same under any engine or worker count and after resume."""
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: bytes only
        return False
    return any(
        (p.name == "seed" and p.kind is not p.POSITIONAL_ONLY) or p.kind is p.VAR_KEYWORD
        for p in params
    )


def open_image(data: Blob | memoryview, max_pixels: int) -> Image.Image:
    """``Image.open`` of ``data``, where ``max_pixels`` decides which images are too large.

    Pillow refuses images over twice its ``Image.MAX_IMAGE_PIXELS``, a setting of the whole
    process (decode processes never see a value the application set): where it is below
    ``max_pixels`` it is raised to it, in whichever process decodes.  The caller checks the
    size against ``max_pixels`` before any pixel is decoded.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and limit < max_pixels:
        Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        # Pillow's message names an in-memory file; its first bytes tell more (an HTML
        # error page saved as .jpg starts "3c 21", a JPEG "ff d8 ff").
        head = bytes(memoryview(data)[:16]).hex(" ")
        raise UnidentifiedImageError(
            f"not an image format Pillow reads ({len(data)} bytes, starting {head})"
        ) from None


def _over(size: tuple[int, int], max_pixels: int) -> bool:
    """Whether an image of ``size`` has more than ``max_pixels`` (turned or not): refused
    before any pixel of it is decoded."""
    return size[0] * size[1] > max_pixels


def to_rgb(img: Image.Image) -> Image.Image:
    """``img`` as RGB: Pillow's ``convert("RGB")`` (alpha dropped, palettes looked up,
    CMYK and grayscale converted as Pillow does), except where that conversion loses the
    picture.  A 16-bit grayscale image (PNG, TIFF: modes ``I;16*``) is reduced to 8 bits by
    its high byte, the rule Pillow itself applies to 16-bit RGB, RGBA and gray-with-alpha
    PNGs (``convert`` would clip every value above 255 to white).  A palette image with
    per-entry transparency goes through RGBA (the same colours; ``convert`` warns)."""
    mode = img.mode
    if mode == "RGB":
        return img
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        high = (np.asarray(img).astype(np.uint16) >> 8).astype(np.uint8)
        return Image.fromarray(high, "L").convert("RGB")
    if mode in ("P", "PA") and "transparency" in img.info:
        return img.convert("RGBA").convert("RGB")
    return img.convert("RGB")


class Region(NamedTuple):
    """A JPEG decoded by region (:func:`_decode_region`), in place in a canvas of the
    (scaled) image's size: pixels outside ``rect`` are not written, and not read."""

    pixels: bytearray | U8Array
    size: tuple[int, int]  # the canvas's (width, height)
    channels: int  # bytes a pixel: 4 (RGBX)
    box: tuple[float, float, float, float]  # the crop's box in the canvas
    rect: tuple[int, int, int, int]  # the region decoded: left, top, width, height


def decode_into(
    data: Blob | memoryview,
    out: U8Array,
    spec: DecodeSpec,
    seed: int,
    key: str,
    mark: tuple[int, int, int, int] | None = None,
) -> None:
    """Decode ``data`` into ``out`` (a CHW uint8 view of a batch slot).  ``mark``: a
    bucketed batch's sample (its bucket's height and width, its recorded height and
    width): cropped to the bucket by :func:`~._transforms.bucket_plan`.

    Raises:
        DecodeError: corrupt or truncated data, a decompression bomb, a hook that returned
            the wrong shape, an image not of its recorded size; the message names ``key``.
    """
    if spec.decode_fn is not None:
        what = shown_key(key)
        try:
            blob = bytes(data) if isinstance(data, memoryview) else data
            arr = np.asarray(
                spec.decode_fn(blob, seed=seed) if spec.hook_seed else spec.decode_fn(blob)  # type: ignore[call-arg]
            )
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
    assert spec.transform is not None or mark is not None
    try:
        img: Image.Image = open_image(data, spec.max_pixels)
        stored = img.size
        if spec.exif_orientation and img.format == "PNG" and not _over(stored, spec.max_pixels):
            img.load()  # as exif_transpose does: an eXIf chunk may follow the pixels
        o = orientation(img) if spec.exif_orientation else 1
        width, height = upright_size(*stored, o)  # the plan's image: upright
        if _over(stored, spec.max_pixels):
            raise DecodeError(
                f"{shown_key(key)} is {width}x{height} pixels, over "
                f"max_pixels={spec.max_pixels} "
                "(decompression bomb?)",
                key=key,
            )
        plan = _plan(spec, width, height, seed, key, mark)
        left, top, right, bottom = plan.box
        out_w, out_h = plan.size
        region = None
        pixels: bytearray | U8Array
        if img.format in _JPEGS:
            want, scale = _jpeg_scale(width, height, plan.box, plan.size)
            if spec.roi and _jpegroi is not None and img.mode in ("RGB", "L"):
                region = _oriented_region(data, scale, stored, o, plan.box, (out_w, out_h))
            if region is None and scale > 1:
                img.draft("RGB", upright_size(*want, o))  # the stored image's axes
                drafted = upright_size(*img.size, o)
                sx, sy = drafted[0] / width, drafted[1] / height
                left, top, right, bottom = left * sx, top * sy, right * sx, bottom * sy
        box = (left, top, right, bottom)
        if region is not None:
            pixels, size, channels, box, _ = region
        else:
            img = to_rgb(img)
            if o != 1:
                img = img.transpose(TRANSPOSE[o])
            if not (spec.roi and _resize is not None):  # today's path: Pillow resizes
                img = img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box)
                _store(np.asarray(img), out, plan.flip)
                return
            pixels, size, channels = np.asarray(img), img.size, 3
        _resize_into(pixels, size, channels, box, (out_w, out_h), out, plan.flip)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(
            f"cannot decode {shown_key(key)}: {type(exc).__name__}: {exc}", key=key
        ) from exc


def _oriented_region(
    data: Blob | memoryview,
    scale: int,
    stored: tuple[int, int],
    o: int,
    box: tuple[float, float, float, float],
    size: tuple[int, int],
) -> Region | None:
    """:func:`_decode_region` for ``box`` of the image upright (EXIF orientation ``o``; its
    stored size ``stored``): the stored region that holds it, decoded, and turned into a
    canvas of the upright scaled size (the region alone is copied; the rest of the canvas
    is not written, as in a stored one), with the box in it."""
    if o == 1:
        return _decode_region(data, scale, *stored, box, size)
    width, height = upright_size(*stored, o)
    got = _decode_region(data, scale, *stored, stored_box(box, *stored, o), upright_size(*size, o))
    if got is None:
        return None
    (cw, ch), (rx, ry, rw, rh) = got.size, got.rect
    uw, uh = upright_size(cw, ch, o)
    turned = np.empty((uh, uw), np.uint32)  # a pixel (RGBX) as one element: 4 bytes a copy
    # The upright canvas seen as stored (the inverse turn, a view): the region goes in place.
    back = upright_array(turned, _INVERSE.get(o, o))
    src = np.frombuffer(got.pixels, np.uint32).reshape(ch, cw)
    back[ry : ry + rh, rx : rx + rw] = src[ry : ry + rh, rx : rx + rw]
    sx, sy = uw / width, uh / height
    left, top, right, bottom = box
    at = (left * sx, top * sy, right * sx, bottom * sy)
    # The region's place upright: the stored canvas is the upright one turned back.
    x0, y0, x1, y1 = (
        int(v) for v in stored_box((rx, ry, rx + rw, ry + rh), uw, uh, _INVERSE.get(o, o))
    )
    pixels = turned.view(np.uint8).reshape(uh, uw, 4)
    return Region(pixels, (uw, uh), 4, at, (x0, y0, x1 - x0, y1 - y0))


_INVERSE = {6: 8, 8: 6}
"""Each orientation's inverse turn, where it is not its own (the quarter turns)."""


def _resize_into(
    pixels: bytearray | U8Array,
    size: tuple[int, int],
    channels: int,
    box: tuple[float, float, float, float],
    out_size: tuple[int, int],
    out: U8Array,
    flip: bool,
) -> None:
    """BILINEAR resize of ``box`` of RGB or RGBX ``pixels`` to ``out_size`` into ``out``
    (CHW), mirrored if ``flip``: Pillow's own pixels, whichever does it."""
    w, h = size
    out_w, out_h = out_size
    if _resize is not None and out.flags.c_contiguous and out.shape == (3, out_h, out_w):
        # Bit for bit Pillow's resize, with the flip, straight into the sample's planes.
        vertical_first = _PILLOW_VERTICAL_FIRST and h > out_h and h - out_h > (w - out_w) * 2
        _resize.resize_into(pixels, w, h, channels, box, out, out_w, out_h, flip, vertical_first)
        return
    mode = "RGBX" if channels == 4 else "RGB"
    img = Image.frombuffer(mode, size, pixels, "raw", mode, 0, 1)
    _store(np.asarray(img.resize((out_w, out_h), Image.Resampling.BILINEAR, box=box)), out, flip)


def _plan(
    spec: DecodeSpec,
    width: int,
    height: int,
    seed: int,
    key: str,
    mark: tuple[int, int, int, int] | None,
) -> Plan:
    """The sample's plan: its transform's, or (``mark``) its bucket's crop.

    Raises:
        DecodeError: a bucketed sample whose image is not of its recorded size (the
            metadata file's ``width``/``height``, or a header read earlier): its bucket and
            crop were chosen for that size.
    """
    rng = random.Random(seed)
    if mark is None:
        assert spec.transform is not None
        return spec.transform.plan(width, height, rng)
    bh, bw, h, w = mark
    if (h, w) == (0, 0):  # on_error="skip": not read when the run began (it logged why)
        raise DecodeError(
            f"{shown_key(key)}: its header could not be read when the run began, so it has "
            "no bucket (on_error='skip' leaves it out)",
            key=key,
        )
    if (h, w) != (height, width):
        raise DecodeError(
            f"{shown_key(key)} is {width}x{height} pixels, but its size was recorded as "
            f"{w}x{h} (the metadata file's width/height, or a header read earlier): its "
            "bucket was chosen for that size. Correct the metadata, or let the headers be "
            "read (leave width/height out)",
            key=key,
        )
    b = spec.buckets
    assert b is not None
    return bucket_plan(width, height, (bh, bw), rng, crop=b.crop, hflip=b.hflip)[0]


def _store(pixels: U8Array, out: U8Array, flip: bool) -> None:
    """HWC RGB or RGBX pixels into ``out`` (CHW), mirrored if ``flip``."""
    arr = pixels[:, :, :3]
    if flip:
        arr = arr[:, ::-1]
    # One strided copy HWC → CHW into shared memory; numpy releases the GIL for it.
    np.copyto(out, arr.transpose(2, 0, 1))


def decode_scale(
    data: Blob | memoryview,
    spec: DecodeSpec,
    seed: int,
    mark: tuple[int, int, int, int] | None = None,
) -> int:
    """The DCT scale (1, 2, 4 or 8) :func:`decode_into` decodes ``data`` at with this
    ``seed`` (and ``mark``, a bucketed sample's: see :func:`decode_into`): 1 for what is not
    a JPEG, or is decoded by a hook; from the header alone.

    Raises:
        Exception: Pillow's, for bytes it cannot open; DecodeError, for a bucketed sample
            whose image is not of its recorded size.
    """
    if spec.decode_fn is not None or (spec.transform is None and mark is None):
        return 1
    img = open_image(data, spec.max_pixels)
    if img.format not in _JPEGS:
        return 1
    o = orientation(img) if spec.exif_orientation else 1
    width, height = upright_size(*img.size, o)
    plan = _plan(spec, width, height, seed, "", mark)
    return _jpeg_scale(width, height, plan.box, plan.size)[1]


def scaled_name(scale: int) -> str:
    """The name of a JPEG's copy for 1/``scale`` beside its cache entry (``jpeg2``: the
    copies that keep the original's EXIF orientation; earlier ones, without it, are not
    read)."""
    return f"jpeg2/{scale}"


def scaled_copies(data: Blob | memoryview, max_pixels: int = MAX_PIXELS) -> list[tuple[str, bytes]]:
    """Copies of a JPEG of at least :data:`SCALED_COPY_MIN` bytes for decoding at 1/4 and
    1/8 scale (see the module's docstring), with their names (:func:`scaled_name`): none
    for anything else, for JPEGs libjpeg-turbo leaves to Pillow (CMYK, corrupt data), for
    images of more than ``max_pixels`` (refused from the header, as a decode refuses
    them), or without the ``_jpegroi`` extension."""
    if _jpegroi is None or len(data) < SCALED_COPY_MIN or bytes(data[:2]) != b"\xff\xd8":
        return []
    try:
        copies = _jpegroi.scaled(data, _SCALED, max_pixels)
    except ValueError:  # not a JPEG libjpeg can read: decoded (and refused) as it is
        return []
    o = jpeg_orientation(data)
    # libjpeg writes a copy without the original's markers: its orientation goes back in,
    # for a decode that turns images upright to find it there.
    mark = exif_segment(o) if o != 1 else b""
    return [
        (scaled_name(s), c[:2] + mark + c[2:])
        for s, c in zip(_SCALED, copies, strict=True)
        if c is not None
    ]


def _jpeg_scale(
    width: int,
    height: int,
    box: tuple[float, float, float, float],
    size: tuple[int, int],
) -> tuple[tuple[int, int], int]:
    """The size a JPEG decode must reach for ``box`` → ``size``, and the DCT scale that
    gives it.  libjpeg decodes at 1/2, 1/4 or 1/8 scale when the crop is at least twice the
    output (it skips most of the IDCT work); draft()'s rule: the largest scale that keeps
    the crop at least as large as the output."""
    left, top, right, bottom = box
    want = (
        math.ceil(width * size[0] / max(right - left, 1)),
        math.ceil(height * size[1] / max(bottom - top, 1)),
    )
    scale = 1
    if want[0] * 2 <= width and want[1] * 2 <= height:
        scale = _dct_scale(width, height, want)
    return want, scale


def _dct_scale(width: int, height: int, want: tuple[int, int]) -> int:
    """The DCT scale Pillow's ``draft`` picks for a decode of at least ``want`` pixels."""
    scale = min(width // want[0], height // want[1])
    return next(s for s in (8, 4, 2, 1) if scale >= s)


def _decode_region(
    data: Blob | memoryview,
    scale: int,
    width: int,
    height: int,
    box: tuple[float, float, float, float],
    size: tuple[int, int],
) -> Region | None:
    """The part of the JPEG, at 1/``scale``, that a BILINEAR resize of ``box`` to ``size``
    reads, in a canvas of the scaled image's size (RGBX): the canvas, its size, 4 bytes a
    pixel, the box in it and the region decoded there; None when libjpeg-turbo leaves it
    to Pillow."""
    assert _jpegroi is not None
    sw, sh = -(-width // scale), -(-height // scale)  # libjpeg's scaled size
    sx, sy = sw / width, sh / height
    left, top, right, bottom = box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy
    # The filter reaches (box / size) / 2 source pixels past the box when shrinking, a
    # pixel when enlarging; one more for rounding.
    mx = math.ceil(max((right - left) / size[0], 1.0)) + 1
    my = math.ceil(max((bottom - top) / size[1], 1.0)) + 1
    x0, x1 = max(int(left) - mx, 0), min(math.ceil(right) + mx, sw)
    y0, y1 = max(int(top) - my, 0), min(math.ceil(bottom) + my, sh)
    got = _jpegroi.decode(data, scale, x0, y0, x1, y1)
    if got is None:
        return None
    # The region is in place in a canvas of the scaled size, in Pillow's own RGBX layout
    # (pages never written are never backed), so the resize sees the same box, in the same
    # coordinates, as a whole decode: the same filter weights, the same pixels.
    canvas, rx, ry, rw, rh, cw, ch = got
    return Region(canvas, (cw, ch), 4, (left, top, right, bottom), (rx, ry, rw, rh))
