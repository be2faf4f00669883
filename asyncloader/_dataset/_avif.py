"""An AVIF's pixel size and orientation from its first bytes, as Pillow reports them once
it has the whole file.

Pillow opens an AVIF only whole (libavif parses it from memory and wants every item's
bytes there), but what it reports of the size and orientation lies near the file's start,
in its ``meta`` box (ISO/IEC 14496-12's box structure, HEIF's items and properties,
ISO/IEC 23008-12): the primary item (``pitm``), and the properties associated with it
(``ipma``, pointing into ``ipco``): its image spatial extents (``ispe``: the width and
height libavif gives Pillow), and its rotation (``irot``) and mirror (``imir``), which
Pillow turns into the EXIF orientation ``exif_transpose`` applies (an EXIF block's own
orientation is replaced by theirs, as HEIF says it is only informative).  A clean aperture
(``clap``) is not applied by Pillow, nor here.

Only a still image is read here: a file whose major brand is ``avif``, whose primary item
is an AV1 image or a grid of them.  An image sequence (``avis``: libavif reads its track,
not its items), any other brand, a ``meta`` box that does not end within the bytes given,
or one that does not hold what is named above gives None: the caller reads the file whole
and asks Pillow, as before.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["avif_size"]

_STILL = (b"av01", b"grid")  # the primary item's types read here
_ORIENTATION = {  # (irot's angle or None, imir's axis or None) → EXIF orientation
    (None, None): 1,
    (None, 0): 4,
    (None, 1): 2,
    (1, None): 8,
    (1, 0): 5,
    (1, 1): 7,
    (2, None): 3,
    (2, 0): 2,
    (2, 1): 4,
    (3, None): 6,
    (3, 0): 7,
    (3, 1): 5,
}
"""As Pillow's AVIF plugin maps them (its ``irot_imir_to_exif_orientation``): ``irot``'s
angle counts quarter turns anticlockwise; ``imir``'s axis 1 swaps left and right, 0 top
and bottom; the rotation comes first (MIAF, ISO/IEC 23000-22, 7.3.6.7)."""


class _Cut(Exception):
    """A box runs past the bytes given, or says less than its kind must."""


def avif_size(data: bytes | bytearray | memoryview) -> tuple[tuple[int, int], int] | None:
    """``((width, height), orientation)`` of the still AVIF whose first bytes are
    ``data``, as Pillow gives them (its ``size``, and the EXIF orientation it reports);
    None where ``data`` does not say them (see the module's docstring)."""
    view = memoryview(bytes(data))
    try:
        top = _boxes(view, 0, len(view))
        kind, start, end = next(top)
        if kind != b"ftyp" or bytes(view[start : start + 4]) != b"avif":
            return None
        for kind, start, end in top:
            if kind == b"meta":
                return _meta(view, start + 4, end)  # a full box: its version and flags
            if kind in (b"moov", b"mdat"):  # a sequence's track; the pixels, no meta yet
                return None
    except (_Cut, StopIteration):
        return None
    return None


def _boxes(view: memoryview, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The boxes from ``start`` to ``end`` of ``view``: each one's type and its body's
    start and end.  Raises _Cut at a box that runs past ``end`` (or past the bytes given:
    a box whose size is 0, which runs to the file's end, is not read either)."""
    at = start
    while at < end:
        if at + 8 > end:
            raise _Cut
        size = int.from_bytes(view[at : at + 4], "big")
        kind = bytes(view[at + 4 : at + 8])
        head = 8
        if size == 1:  # a 64-bit size follows the type
            if at + 16 > end:
                raise _Cut
            size, head = int.from_bytes(view[at + 8 : at + 16], "big"), 16
        if size < head or at + size > end:
            raise _Cut
        yield kind, at + head, at + size
        at += size


def _meta(view: memoryview, start: int, end: int) -> tuple[tuple[int, int], int] | None:
    """What the ``meta`` box's body (``start`` to ``end``, after its version and flags)
    says of its primary item: its size and orientation."""
    primary = None
    types: dict[int, bytes] = {}
    properties: list[tuple[bytes, int, int]] = []
    links: dict[int, list[int]] = {}
    for kind, at, stop in _boxes(view, start, end):
        if kind == b"pitm":
            primary = _uint(view, at + 4, 2 if _uint(view, at, 1, stop) == 0 else 4, stop)
        elif kind == b"iinf":
            types = _item_types(view, at, stop)
        elif kind == b"iprp":
            for inner, i, j in _boxes(view, at, stop):
                if inner == b"ipco":
                    properties = list(_boxes(view, i, j))
                elif inner == b"ipma":
                    for item, indices in _associations(view, i, j):
                        links.setdefault(item, []).extend(indices)
    if primary is None or types.get(primary) not in _STILL:
        return None
    size, angle, axis = None, None, None
    for index in links.get(primary, []):
        if not 1 <= index <= len(properties):
            return None
        kind, at, stop = properties[index - 1]
        if kind == b"ispe" and size is None:
            width, height = _uint(view, at + 4, 4, stop), _uint(view, at + 8, 4, stop)
            size = (width, height)
        elif kind == b"irot" and angle is None:
            angle = _uint(view, at, 1, stop) & 3 or None
        elif kind == b"imir" and axis is None:
            axis = _uint(view, at, 1, stop) & 1
    if size is None or min(size) <= 0:
        return None
    return size, _ORIENTATION[angle, axis]


def _item_types(view: memoryview, start: int, end: int) -> dict[int, bytes]:
    """Each item's type, by its ID, from the ``iinf`` box's body: its ``infe`` boxes of
    version 2 or 3 (the older ones name no type: their items are left out)."""
    count_size = 2 if _uint(view, start, 1, end) == 0 else 4
    _uint(view, start + 4, count_size, end)
    out = {}
    for kind, at, stop in _boxes(view, start + 4 + count_size, end):
        version = _uint(view, at, 1, stop)
        if kind != b"infe" or version < 2:
            continue
        id_size = 2 if version == 2 else 4
        item = _uint(view, at + 4, id_size, stop)
        where = at + 4 + id_size + 2  # after the item's protection index
        if where + 4 > stop:
            raise _Cut
        out[item] = bytes(view[where : where + 4])
    return out


def _associations(view: memoryview, start: int, end: int) -> Iterator[tuple[int, list[int]]]:
    """Each item's associated properties (their 1-based indices in ``ipco``; 0: none), from
    the ``ipma`` box's body."""
    version, flags = _uint(view, start, 1, end), _uint(view, start + 1, 3, end)
    id_size, index_size = (2 if version < 1 else 4), (2 if flags & 1 else 1)
    mask = 0x7FFF if index_size == 2 else 0x7F  # the high bit: "essential"
    count = _uint(view, start + 4, 4, end)
    at = start + 8
    for _ in range(count):
        item = _uint(view, at, id_size, end)
        n = _uint(view, at + id_size, 1, end)
        at += id_size + 1
        yield item, [_uint(view, at + k * index_size, index_size, end) & mask for k in range(n)]
        at += n * index_size


def _uint(view: memoryview, at: int, size: int, end: int) -> int:
    """The big-endian unsigned integer of ``size`` bytes at ``at``, which must end by
    ``end``."""
    if at + size > end:
        raise _Cut
    return int.from_bytes(view[at : at + size], "big")
