"""An AVIF's size and orientation from its first bytes (its ``meta`` box): what Pillow
reports of the whole file, for every rotation and mirror HEIF can state; None, never a
wrong answer, from bytes that stop short of the box or from a file this reader leaves to
Pillow (an image sequence, another brand)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from asyncloader._base._orientation import orientation, upright_size
from asyncloader._dataset._avif import avif_size
from asyncloader._dataset._headers import HEAD_BYTES
from asyncloader._dataset._imagesize import header_sizes

pytestmark = pytest.mark.skipif(
    "AVIF" not in Image.registered_extensions().values(), reason="Pillow without AVIF"
)


def _avif(o: int, width: int = 300, height: int = 200, mode: str = "RGB", **kw: object) -> bytes:
    """Noise saved as AVIF by Pillow with EXIF orientation ``o`` (which its encoder writes
    as ``irot`` and ``imir``) and a camera's name in the EXIF block."""
    channels = 4 if mode == "RGBA" else 3
    rng = np.random.default_rng(o)
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = o
    exif[0x010F] = "Camera"
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, "AVIF", exif=exif.tobytes(), **kw)
    return buf.getvalue()


def _pillows(data: bytes) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(height, width)`` as stored and upright, as Pillow reports them of the whole file."""
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        uw, uh = upright_size(width, height, orientation(img))
    return (height, width), (uh, uw)


def _set(data: bytes, box: bytes, value: int) -> bytes:
    """``data`` with the one-byte body of its first ``box`` (``irot``, ``imir``) set."""
    at = data.index(box) + 4
    return data[:at] + bytes([value]) + data[at + 1 :]


def test_every_rotation_and_mirror_is_pillows_size_and_orientation() -> None:
    # Pillow writes orientation 5 as both boxes, 3 as a rotation, 2 as a mirror, 1 as
    # neither; their bytes set in place give every angle with and without each axis.
    both, turned, mirrored, plain = (_avif(o, 700, 430) for o in (5, 3, 2, 1))
    assert min(map(len, (both, turned, mirrored, plain))) > HEAD_BYTES  # cut in the test
    files = [plain]
    files += [_set(_set(both, b"irot", a), b"imir", x) for a in range(4) for x in range(2)]
    files += [_set(turned, b"irot", a) for a in range(4)]
    files += [_set(mirrored, b"imir", x) for x in range(2)]
    seen = set()
    for data in files:
        want = _pillows(data)
        head = data[:HEAD_BYTES]
        assert header_sizes(head) == want
        (width, height), o = avif_size(head)  # type: ignore[misc]
        assert (height, width) == want[0]
        seen.add(o)
    assert seen == set(range(1, 9))  # every orientation came up


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_an_image_with_alpha_or_grey_is_its_primary_items_size(mode: str) -> None:
    """An alpha plane is an item of its own, with its own extents: the primary item's are
    the image's."""
    data = _avif(6, 333, 121, mode)
    assert header_sizes(data[:4096]) == _pillows(data) == ((121, 333), (333, 121))


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=2000), o=st.integers(min_value=1, max_value=8))
def test_bytes_cut_anywhere_give_the_answer_or_none(cut: int, o: int) -> None:
    data = _avif(o, 40, 24)
    got = header_sizes(data[:cut])
    assert got is None or got == _pillows(data)


@settings(max_examples=200, deadline=None)
@given(at=st.integers(min_value=0, max_value=400), value=st.integers(min_value=0, max_value=255))
def test_a_changed_byte_in_the_head_is_never_an_exception(at: int, value: int) -> None:
    data = bytearray(_avif(7, 40, 24))
    data[at % len(data)] = value
    got = avif_size(bytes(data[:512]))
    assert got is None or (min(got[0]) > 0 and 1 <= got[1] <= 8)


def test_files_left_to_pillow_whole() -> None:
    data = _avif(6)
    assert data[8:12] == b"avif"  # ftyp's major brand
    # An image sequence (libavif reads its track) and another major brand: not read here.
    for brand in (b"avis", b"mif1"):
        assert avif_size(data[:8] + brand + data[12:]) is None
    # A meta box that ends beyond the bytes given; a box whose size runs past them.
    meta = data.index(b"meta") - 4
    assert avif_size(data[: meta + 20]) is None
    assert avif_size(data[:meta] + (1 << 30).to_bytes(4, "big") + data[meta + 4 :]) is None
    # Not an AVIF at all.
    assert avif_size(b"\x00\x00\x00\x0cjP  \r\n\x87\n") is None
    assert avif_size(b"") is None


def test_a_primary_item_of_another_type_is_left_to_pillow() -> None:
    """An item of a type this reader does not know (a gain map's tone-mapped image, say) as
    the primary one: read whole, not guessed."""
    data = _avif(1)
    at = data.index(b"av01")  # the primary item's type in its infe box
    assert avif_size(data[:at] + b"tmap" + data[at + 4 :]) is None
    assert avif_size(data) is not None
