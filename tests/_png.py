"""PNGs as some writers make them, for the tests of the orientation and the header pass."""

from __future__ import annotations

import io
import zlib

from PIL import Image


def late_exif_png(img: Image.Image, o: int, padding: int = 0) -> bytes:
    """A PNG whose ``eXIf`` chunk follows its pixels (before ``IEND``), where some writers
    put it: Pillow's ``open`` does not see it, its load (and so ``exif_transpose``) does.
    ``padding``: bytes of a text chunk between the pixels and it (a reader of the first
    64 KiB then has the pixels' start and not the orientation)."""
    buf = io.BytesIO()
    img.save(buf, "PNG")
    data = buf.getvalue()
    exif = Image.Exif()
    exif[0x0112] = o
    body = exif.tobytes().removeprefix(b"Exif\x00\x00")
    chunks = _chunk(b"tEXt", b"Comment\x00" + b"x" * padding) if padding else b""
    end = data.rindex(b"IEND") - 4
    return data[:end] + chunks + _chunk(b"eXIf", body) + data[end:]


def _chunk(kind: bytes, body: bytes) -> bytes:
    """A PNG chunk: its length, its type, ``body``, its CRC."""
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
