"""What an image's first bytes say of its pixel size, as stored and turned upright by its
EXIF orientation — or that they do not say it, and the reader must read further.

Pillow opens most formats from their first bytes (a JPEG's frame header, a PNG's IHDR), and
its answer is the one taken.  Some it opens only whole: a WebP (libwebp's demuxer wants the
whole file), an AVIF (libavif's parser too), a TIFF whose directory follows its pixels.  A
WebP's size is read here from its first 30 bytes instead (its ``VP8X`` canvas, or its one
frame's header: what Pillow reports once it has the whole file), a still AVIF's size and
orientation from its ``meta`` box near its start (:mod:`._avif`); the others are read
whole by the caller.

The upright size needs the orientation, and two formats may hold it after their pixels: a
PNG may put its ``eXIf`` chunk there (Pillow's ``exif_transpose`` loads the image first and
finds it), and a WebP keeps its ``EXIF`` and ``XMP`` chunks there.  Of a PNG cut before
its end whose chunks before the pixels hold no orientation, and of a WebP whose header says
it has metadata, the upright size is known from the object's last bytes (``tail``: the
chunks there, :func:`~.._base._orientation.png_tail_info`), else only once the whole
object is read; of a whole PNG, every chunk is read
(:func:`~.._base._orientation.png_info`).
"""

from __future__ import annotations

import io

from PIL import Image

from .._base._orientation import (
    info_orientation,
    orientation,
    places,
    png_info,
    png_tail_info,
    upright_size,
)
from ._avif import avif_size

__all__ = ["Sizes", "header_size", "header_sizes", "object_sizes"]

Sizes = tuple[tuple[int, int], "tuple[int, int] | None"]
"""``(height, width)`` as stored, and upright (None: not known from the bytes read)."""

_WEBP_META = 0x08 | 0x04  # a VP8X header's flags: EXIF, XMP (both after the pixels)
_WEBP_CHUNKS = {b"EXIF": "exif", b"XMP ": "xmp"}  # as Pillow's info names them


def header_size(
    data: bytes | bytearray | memoryview, upright: bool = False, *, whole: bool = False
) -> tuple[int, int] | None:
    """``(height, width)`` from the first bytes of an image, or None where they do not
    reach its header (or it is not an image Pillow reads).  ``upright``: of the image
    turned upright by its EXIF orientation — None also where that may lie further
    (see the module's docstring).  ``whole``: ``data`` is the whole object."""
    both = header_sizes(data, whole=whole)
    return None if both is None else both[1 if upright else 0]


def header_sizes(
    data: bytes | bytearray | memoryview,
    *,
    whole: bool = False,
    tail: bytes | bytearray | memoryview | None = None,
) -> Sizes | None:
    """:func:`header_size` both ways, as stored and upright, from one reading; None where
    not even the stored size is in ``data``.  ``tail``: the object's last bytes, where
    the orientation may follow the pixels (see the module's docstring)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            stored_o = orientation(img)
            o: int | None = stored_o
            if img.format == "PNG" and (whole or stored_o == 1):
                o = _png_orientation(img, data, stored_o, whole, tail)
    except Exception:  # cut short, or not an image: the caller reads more, or fails
        return None if whole else _webp(bytes(data[:30]), tail) or _avif(data)
    if width <= 0 or height <= 0:
        return None
    if o is None:
        return (height, width), None
    uw, uh = upright_size(width, height, o)
    return (height, width), (uh, uw)


def _png_orientation(
    img: Image.Image,
    data: bytes | bytearray | memoryview,
    o: int,
    whole: bool,
    tail: bytes | bytearray | memoryview | None,
) -> int | None:
    """The orientation of the PNG ``img`` (opened from ``data``, its chunks before the
    pixels giving ``o``) once the chunks after its pixels are read: every chunk where
    ``data`` is ``whole``; else those of ``tail`` (not of an animated PNG, whose load
    stops at its next frame); None where they are not known."""
    if whole:
        info = png_info(data)  # None: no IEND; what the chunks before the pixels say
        return o if info is None else info_orientation(info)
    if tail is None or getattr(img, "is_animated", False):
        return None
    after = png_tail_info(tail)
    return None if after is None else info_orientation({**img.info, **after})


def object_sizes(
    data: bytes | bytearray | memoryview, first: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """:func:`header_sizes` of a whole object (``asyncloader warm`` notes them from the
    bytes it fetched): from its first ``first`` bytes where they give both, else from all
    of it; None where it is not an image Pillow reads."""
    both = header_sizes(memoryview(data)[:first], whole=len(data) <= first)
    if both is None or both[1] is None:
        both = header_sizes(data, whole=True)
    return None if both is None or both[1] is None else (both[0], both[1])


def _avif(data: bytes | bytearray | memoryview) -> Sizes | None:
    """Both sizes of an AVIF from its ``meta`` box (:func:`._avif.avif_size`), where
    ``data`` holds it."""
    found = avif_size(data)
    if found is None:
        return None
    (width, height), o = found
    uw, uh = upright_size(width, height, o)
    return (height, width), (uh, uw)


def _webp(head: bytes, tail: bytes | bytearray | memoryview | None = None) -> Sizes | None:
    """:func:`header_sizes` of a WebP from its first 30 bytes (its RIFF header and its
    first chunk's): the ``VP8X`` canvas, or the lossy or lossless frame's size; upright the
    same where no EXIF or XMP follows (the ``VP8X`` flags say so; a simple WebP has none),
    else from ``tail`` where its metadata chunks are there.  None for anything else."""
    if len(head) < 30 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    kind = head[12:16]
    meta = False
    if kind == b"VP8X":
        meta = bool(head[20] & _WEBP_META)
        width = 1 + int.from_bytes(head[24:27], "little")
        height = 1 + int.from_bytes(head[27:30], "little")
    elif kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":  # a key frame's start code
        width = int.from_bytes(head[26:28], "little") & 0x3FFF
        height = int.from_bytes(head[28:30], "little") & 0x3FFF
    elif kind == b"VP8L" and head[20] == 0x2F:  # the lossless signature
        bits = int.from_bytes(head[21:25], "little")
        width, height = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    else:
        return None
    if width <= 0 or height <= 0:
        return None
    if not meta:
        return (height, width), (height, width)
    info = None if tail is None else _webp_tail_info(bytes(tail))
    if info is None:
        return (height, width), None
    uw, uh = upright_size(width, height, info_orientation(info))
    return (height, width), (uh, uw)


def _webp_tail_info(tail: bytes) -> dict[str, bytes] | None:
    """The ``info`` Pillow gives a WebP from the metadata chunks at its end (``EXIF``,
    ``XMP``: they follow the pixels), read from its last bytes ``tail``: the first run of
    such chunks whose lengths lead exactly to the file's end; None where there is none."""
    for start in sorted(i for kind in _WEBP_CHUNKS for i in places(tail, kind)):
        at, info = start, dict[str, bytes]()
        while at + 8 <= len(tail) and tail[at : at + 4] in _WEBP_CHUNKS:
            length = int.from_bytes(tail[at + 4 : at + 8], "little")
            info.setdefault(_WEBP_CHUNKS[tail[at : at + 4]], tail[at + 8 : at + 8 + length])
            at += 8 + length + (length & 1)  # padded to an even length
        if at == len(tail):
            return info
    return None
