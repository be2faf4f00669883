"""EXIF orientation (``DecodeConfig(exif_orientation=True)``): the tag a camera or phone
writes instead of turning the pixels, read as Pillow's ``ImageOps.exif_transpose`` reads it,
and the geometry of turning an image upright.

Orientations 1–8 are the EXIF ones: 1 upright, 2 mirrored, 3 turned half round, 4 upside
down mirrored, 5–8 the four that swap width and height.  :data:`TRANSPOSE` is the Pillow
transpose that makes each upright (``exif_transpose``'s own table); :func:`upright_array`
is the same on an ``(H, W, C)`` array; :func:`stored_box` maps a box in the upright image
back to the stored one, where a decoder reads it.
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image

__all__ = [
    "TRANSPOSE",
    "exif_segment",
    "info_orientation",
    "jpeg_orientation",
    "jpeg_turned",
    "orientation",
    "places",
    "png_info",
    "png_tail_info",
    "stored_box",
    "upright_array",
    "upright_size",
]

_TAG = 0x0112  # Orientation, in IFD0

TRANSPOSE: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""Each orientation's Pillow transpose to upright (``ImageOps.exif_transpose``'s)."""


def orientation(img: Image.Image) -> int:
    """The EXIF orientation of the opened ``img`` (1–8) that is still to be applied, as
    ``ImageOps.exif_transpose`` finds it (its EXIF block's IFD0, or its XMP where the EXIF
    has none); 1 where it has none, or where the block cannot be read or holds no
    orientation 2–8 (a damaged EXIF block turns nothing, and fails nothing: it is read
    here, without Pillow's warnings), and for a TIFF (Pillow turns it as it loads it)."""
    if img.format == "TIFF":
        # Pillow turns a TIFF itself: its size is the upright one from the start, and its
        # load turns the pixels (and drops the tag), with or without the option.
        return 1
    return info_orientation(img.info)


def info_orientation(info: Mapping[Any, Any]) -> int:
    """:func:`orientation` from an image's ``info`` (Pillow's, or :func:`png_info`'s)."""
    exif = info.get("exif")
    return _orientation_of(
        bytes(exif) if isinstance(exif, (bytes, bytearray)) else _raw_profile(info),
        info.get("XML:com.adobe.xmp") or info.get("xmp"),  # Pillow's order
    )


def png_info(data: bytes | bytearray | memoryview) -> dict[Any, Any] | None:
    """The ``info`` Pillow's load leaves on the PNG ``data`` — its chunks' before the image
    data, as ``Image.open`` reads them, and those after it, as the load goes on to read
    them (an ``eXIf`` chunk may follow the image data: ``exif_transpose`` loads the image
    first, and turns it by that one) — read without decoding a pixel, by Pillow's own
    chunk reader.  None where ``data`` ends before the PNG does (its ``IEND``) or is not a
    PNG that reader follows.  Of an animated PNG, as Pillow's load of its first frame
    reads it: up to the next frame's control chunk."""
    from PIL import PngImagePlugin

    fp = io.BytesIO(bytes(data))
    if fp.read(8) != b"\x89PNG\r\n\x1a\n":
        return None
    stream = PngImagePlugin.PngStream(fp)
    seen_data = False
    try:
        while True:
            cid, pos, length = stream.read()
            if cid == b"IEND" or (cid == b"fcTL" and seen_data and (stream.im_n_frames or 1) > 1):
                return dict(stream.im_info)
            if cid in (b"IDAT", b"fdAT"):  # pixels: passed over
                seen_data = True
                fp.seek(length, io.SEEK_CUR)
            else:
                try:
                    stream.call(cid, pos, length)
                except AttributeError:  # a chunk Pillow does not read
                    fp.seek(length, io.SEEK_CUR)
            if len(fp.read(4)) < 4:  # its CRC (Pillow's load checks none after the pixels)
                return None
    except Exception:  # cut short, or a chunk Pillow's reader refuses
        return None


_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk, the same in every PNG
_PNG_TEXTS = (b"eXIf", b"tEXt", b"zTXt", b"iTXt")


def png_tail_info(tail: bytes | bytearray | memoryview) -> dict[Any, Any] | None:
    """What the chunks of a PNG's last bytes (``tail``) that may carry an orientation
    (``eXIf``, and the text chunks ``png_info`` reads for it) add to its ``info``, in file
    order, as Pillow's load adds them after the pixels; None where ``tail`` is not a
    PNG's end (its ``IEND``).  A chunk is taken where its length, type and CRC agree (a
    CRC is 32 bits: pixel data that looks like such a chunk by chance is not a worry)."""
    from PIL import PngImagePlugin

    tail = bytes(tail)
    if not tail.endswith(_PNG_END):
        return None
    found: list[tuple[int, bytes, int]] = []  # (start of the body, type, length)
    for kind in _PNG_TEXTS:
        for at in places(tail, kind, 4):
            length = int.from_bytes(tail[at - 4 : at], "big")
            end = at + 4 + length
            crc = tail[end : end + 4]
            if len(crc) == 4 and zlib.crc32(tail[at:end]) == int.from_bytes(crc, "big"):
                found.append((at + 4, kind, length))
    fp = io.BytesIO(tail)
    stream = PngImagePlugin.PngStream(fp)
    for start, kind, length in sorted(found):
        fp.seek(start)
        try:
            stream.call(kind, start, length)
        except Exception:  # a chunk Pillow's reader refuses (its load would fail on it)
            return None
    return dict(stream.im_info)


def places(data: bytes, part: bytes, start: int = 0) -> list[int]:
    """Where ``part`` begins in ``data`` at or after ``start``, every place (a chunk's
    type found in a file's last bytes, where its header is then checked)."""
    out, at = [], data.find(part, start)
    while at >= 0:
        out.append(at)
        at = data.find(part, at + 1)
    return out


def _raw_profile(info: Mapping[Any, Any]) -> bytes | None:
    """The EXIF block a PNG holds as text, as ImageMagick writes it (a "Raw profile type
    exif" chunk: an empty line, the name, the length, then the bytes in hex lines) and as
    Pillow's ``getexif`` reads it where the PNG has no ``eXIf`` chunk; None where it has
    none or the hex cannot be read (a damaged block turns nothing)."""
    text = info.get("Raw profile type exif")
    if not isinstance(text, str):
        return None
    try:
        return bytes.fromhex("".join(text.split("\n")[3:]))
    except ValueError:
        return None


def jpeg_orientation(data: bytes | bytearray | memoryview) -> int:
    """:func:`orientation` of the JPEG ``data`` from its markers alone, in microseconds (no
    Pillow): its APP1 segments before the scan, read as Pillow reads them (the EXIF ones
    joined, the last XMP one)."""
    view = memoryview(data)
    n, i = len(view), 2
    exif: bytes | None = None
    xmp: bytes | None = None
    while i + 4 <= n and view[i] == 0xFF:
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0xDA or not 0xC0 <= marker <= 0xFE:  # the scan, or no segment
            break
        length = (view[i + 2] << 8) | view[i + 3]
        if marker == 0xE1:
            body = bytes(view[i + 4 : i + 2 + length])
            if body.startswith(b"Exif\x00\x00"):
                exif = body if exif is None else exif + body[6:]
            elif body.startswith(_XMP_APP1):
                xmp = body.split(b"\x00", 1)[1]
        i += 2 + length
    return _orientation_of(exif, xmp)


def jpeg_turned(data: bytes | bytearray | memoryview) -> bool:
    """Whether the JPEG ``data`` has an EXIF orientation other than 1
    (:func:`jpeg_orientation`)."""
    return jpeg_orientation(data) != 1


_XMP = re.compile(r'tiff:Orientation(="|>)([0-9])')  # Pillow's own reading of XMP
_XMP_APP1 = b"http://ns.adobe.com/xap/1.0/\x00"  # an XMP APP1 segment's start


def _orientation_of(exif: bytes | None, xmp: object) -> int:
    """The orientation an EXIF block (``exif``) and XMP text (``xmp``, str or bytes) give:
    the EXIF tag, else the XMP one, else 1; 1 for a value outside 1–8."""
    if exif is not None:
        o = _ifd0_orientation(exif)
        if o is not None:
            return o if o in TRANSPOSE else 1
    if isinstance(xmp, bytes):
        xmp = xmp.decode("utf-8", "replace")
    if isinstance(xmp, str):
        found = _XMP.search(xmp)
        if found:
            return int(found[2]) if int(found[2]) in TRANSPOSE else 1
    return 1


def _ifd0_orientation(block: bytes) -> int | None:
    """The orientation tag of an EXIF block's first IFD (a TIFF header and IFDs, after an
    ``Exif\0\0`` prefix where it has one); None where the block has none or is cut."""
    if block.startswith(b"Exif\x00\x00"):
        block = block[6:]
    order = {b"II": "<", b"MM": ">"}.get(block[:2])
    if order is None or len(block) < 8:
        return None
    (at,) = struct.unpack_from(order + "I", block, 4)
    if at + 2 > len(block):
        return None
    (count,) = struct.unpack_from(order + "H", block, at)
    for i in range(count):
        entry = at + 2 + 12 * i
        if entry + 12 > len(block):
            return None
        tag, kind, n = struct.unpack_from(order + "HHI", block, entry)
        if tag != _TAG:
            continue
        if n < 1 or kind not in (3, 4):  # SHORT or LONG
            return 0
        return int(struct.unpack_from(order + ("H" if kind == 3 else "I"), block, entry + 8)[0])
    return None


def upright_size(width: int, height: int, o: int) -> tuple[int, int]:
    """``(width, height)`` of the image upright, for a stored ``width × height``."""
    return (height, width) if o >= 5 else (width, height)


def upright_array(arr: np.ndarray[Any, Any], o: int) -> np.ndarray[Any, Any]:
    """``arr`` (``(H, W, ...)``, stored) turned upright as Pillow's :data:`TRANSPOSE` turns
    an image: a view (no copy)."""
    if o == 2:
        return arr[:, ::-1]
    if o == 3:
        return arr[::-1, ::-1]
    if o == 4:
        return arr[::-1]
    if o == 5:
        return arr.swapaxes(0, 1)
    if o == 6:  # ROTATE_270: a quarter turn clockwise
        return arr.swapaxes(0, 1)[:, ::-1]
    if o == 7:
        return arr.swapaxes(0, 1)[::-1, ::-1]
    if o == 8:  # ROTATE_90: a quarter turn anticlockwise
        return arr.swapaxes(0, 1)[::-1]
    return arr


def stored_box(
    box: tuple[float, float, float, float], width: int, height: int, o: int
) -> tuple[float, float, float, float]:
    """The box ``(left, top, right, bottom)`` of the upright image, in the stored image
    of ``width × height`` pixels (the same pixels, as a decoder finds them there)."""
    left, top, right, bottom = box
    w, h = float(width), float(height)
    if o == 2:
        return (w - right, top, w - left, bottom)
    if o == 3:
        return (w - right, h - bottom, w - left, h - top)
    if o == 4:
        return (left, h - bottom, right, h - top)
    if o == 5:
        return (top, left, bottom, right)
    if o == 6:
        return (top, h - right, bottom, h - left)
    if o == 7:
        return (w - bottom, h - right, w - top, h - left)
    if o == 8:
        return (w - bottom, left, w - top, right)
    return box


def exif_segment(o: int) -> bytes:
    """A JPEG APP1 segment holding EXIF orientation ``o`` alone (a scaled copy's, which
    libjpeg writes without the original's markers)."""
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8)  # big-endian TIFF, IFD0 at 8
    tiff += struct.pack(">H", 1) + struct.pack(">HHIHH", _TAG, 3, 1, o, 0) + b"\x00" * 4
    body = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body
