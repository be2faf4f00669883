"""The images' headers, read for their sizes (``_dataset/_headers.py``): in the node's cache
where it holds the image, else one range read per object from the store; an image that
read fetched whole is handed to the cache in bounded chunks, only where it stays a sample
(every image read, or those a filter on the sizes keeps)."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from asyncloader._base._stats import Counters
from asyncloader._base._types import ObjectInfo, ObjectStore
from asyncloader._cache import ObjectCache
from asyncloader._dataset import _headers
from asyncloader._dataset._headers import HEAD_BYTES, Keep, Stays, every_one, read_headers
from asyncloader._dataset._imagesize import header_size, header_sizes
from asyncloader._run._cache_fill import CacheHeads
from asyncloader.testing import MemoryStore

from ._png import late_exif_png


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20 + i, 10 + 2 * i), (9 * i, 80, 40)).save(buf, "JPEG")
    return buf.getvalue()


class _Counted(CacheHeads):
    """The cache as the header pass sees it, counting its hand-overs."""

    def __init__(self, cache: ObjectCache) -> None:
        super().__init__(cache)
        self.handed: list[int] = []
        self.threads: set[int] = set()  # where the hand-overs ran
        self.closed: list[int] = []  # where the keeper was closed

    def keeper(self, store: ObjectStore, objects: Sequence[ObjectInfo]) -> Keep:
        return _CountedKeep(super().keeper(store, objects), self)


class _CountedKeep:
    def __init__(self, keep: Keep, heads: _Counted) -> None:
        self.keep, self.heads = keep, heads

    def __call__(self, items: Sequence[tuple[ObjectInfo, bytes]]) -> int:
        self.heads.handed.append(len(items))
        self.heads.threads.add(threading.get_ident())
        return self.keep(items)

    def close(self) -> None:
        self.heads.closed.append(threading.get_ident())
        self.keep.close()


def _wide(keys: Sequence[str], sizes: Sequence[tuple[int, int]]) -> list[bool]:
    """A filter on the sizes: ``width >= 35`` (images 15 to 29 of :func:`_jpeg`'s)."""
    return [size[1] >= 35 for size in sizes]


@pytest.mark.parametrize("stays", [every_one, _wide, None], ids=["every", "filter", "none"])
def test_whole_images_go_to_the_cache_in_chunks_and_are_read_there_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stays: Stays | None
) -> None:
    data = {f"i{i:02d}.jpg": _jpeg(i) for i in range(30)}
    big = b"\xff\xd8" + b"\x00" * (HEAD_BYTES + 10)  # no header in its first read: not kept
    store = MemoryStore({**data, "big.jpg": big}, name="heads")
    listed = asyncio.run(_listed(store))
    objects = [o for o in listed if o.key != "big.jpg"]
    chunk = 3 * max(len(d) for d in data.values())
    monkeypatch.setattr(_headers, "_KEEP_CHUNK", chunk)
    cache = ObjectCache(tmp_path)
    heads = _Counted(cache)
    counters = Counters()
    found, failed = asyncio.run(read_headers(store, objects, counters, heads, stays=stays))
    want = {i: (10 + 2 * int(o.key[1:3]), 20 + int(o.key[1:3])) for i, o in enumerate(objects)}
    assert found == want and failed == {}
    assert counters.requests == len(objects)
    staying = {
        o.key for i, o in enumerate(objects) if stays is not None and stays([o.key], [want[i]])[0]
    }
    assert len(staying) == {"every": 30, "filter": 15, "none": 0}[_id(stays)]
    if staying:  # those, in several hand-overs of a few images each, on one thread
        assert sum(heads.handed) == len(staying) == counters.cache_stored
        assert len(heads.handed) >= len(staying) // 4 and max(heads.handed) <= 4
        assert {k.split("\x00")[1] for k in cache.entry_keys()} == staying
        assert len(heads.threads) == 1
        for _ in range(100):  # closed there once its work is done
            if heads.closed:
                break
            time.sleep(0.05)
        assert heads.closed == list(heads.threads)
    else:  # none of them is known to be a sample
        assert heads.handed == [] and counters.cache_stored == 0
        assert list(cache.entry_keys()) == []
    # Again: from the cache where it holds them, the store only for the rest.
    again = Counters()
    found, failed = asyncio.run(read_headers(store, objects, again, heads, stays=stays))
    assert found == want and failed == {}
    assert again.requests == len(objects) - len(staying)
    # An object whose first read holds no header is read again further, then fails as the
    # image's own fault: it is never kept.
    _, failed = asyncio.run(
        read_headers(
            store, [o for o in listed if o.key == "big.jpg"], Counters(), heads, stays=every_one
        )
    )
    assert list(failed) == [0] and "big.jpg" in str(failed[0])
    assert "big.jpg" not in {k.split("\x00")[1] for k in cache.entry_keys()}
    cache.close()


def _id(stays: Stays | None) -> str:
    return {every_one: "every", _wide: "filter", None: "none"}[stays]


async def _listed(store: MemoryStore) -> list[ObjectInfo]:
    return sorted([o async for o in store.list()], key=lambda o: o.key)


# --- formats whose first bytes Pillow does not open -----------------------------------------


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    """Noise: it keeps an image's file large (past the reads' steps) at a small size."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _saved(img: Image.Image, fmt: str, o: int = 1, **kw: Any) -> bytes:
    buf = io.BytesIO()
    if o != 1:
        exif = Image.Exif()
        exif[0x0112] = o
        kw["exif"] = exif
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _webps() -> dict[str, bytes]:
    """WebPs of each header kind: lossy (``VP8``), lossless (``VP8L``), extended (``VP8X``:
    with alpha, animated, with EXIF after the pixels)."""
    pic = _noise(173, 94)
    frames = [_noise(61, 45, s) for s in range(3)]
    anim = io.BytesIO()
    frames[0].save(anim, "WEBP", save_all=True, append_images=frames[1:], duration=40)
    return {
        "lossy": _saved(pic, "WEBP", quality=80),
        "lossless": _saved(pic, "WEBP", lossless=True),
        "alpha": _saved(pic.convert("RGBA"), "WEBP", quality=80),
        "animated": anim.getvalue(),
        "exif": _saved(pic, "WEBP", 6, quality=80),
    }


@pytest.mark.parametrize("cut", [30, 100, 4096])
def test_a_webp_s_size_comes_from_its_first_bytes_as_pillow_gives_it_whole(cut: int) -> None:
    """libwebp's demuxer (Pillow's open) wants the whole file; its first 30 bytes say the
    size.  The upright size too where no EXIF or XMP follows the pixels; else not yet."""
    for kind, data in _webps().items():
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
        assert header_sizes(data, whole=True) == (
            (height, width),
            (width, height) if kind == "exif" else (height, width),
        ), kind
        assert header_size(data[:cut]) == (height, width), kind
        upright = header_size(data[:cut], upright=True)
        assert upright == (None if kind == "exif" else (height, width)), kind
    assert header_size(_webps()["lossy"][:29]) is None  # not yet its frame's header
    assert header_size(b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(20)) is None  # no start code


def test_images_pillow_opens_only_whole_are_read_whole_once(tmp_path: Path) -> None:
    """A WebP and an AVIF from its first read whatever its size; a TIFF whose directory
    follows its pixels, read whole after it (and kept by the cache, which the next pass
    reads instead); a PNG, or a WebP with EXIF, whose orientation may follow its pixels,
    at its end too for its upright size.  The sizes are Pillow's of the whole images,
    upright where asked."""
    big = _noise(700, 520)  # each file above HEAD_MAX: no read of a step short of whole
    png = io.BytesIO()
    _noise(300, 200).save(png, "PNG")
    data = {
        "a.webp": _saved(big, "WEBP", lossless=True),
        "b.webp": _saved(big, "WEBP", 6, lossless=True),
        "c.avif": _saved(_noise(1000, 760), "AVIF", quality=100),  # AVIF packs noise tighter
        "d.tif": _saved(big, "TIFF", compression="tiff_lzw"),
        "e.png": png.getvalue(),
        "f.jpg": _jpeg(3),
        "g.png": late_exif_png(_noise(300, 200, 1), 8),
    }
    assert all(len(d) > _headers.HEAD_MAX for k, d in data.items() if k[0] in "abcd")
    assert min(len(data["e.png"]), len(data["g.png"])) > 2 * HEAD_BYTES
    store = MemoryStore(data, name="formats")
    objects = asyncio.run(_listed(store))
    want = {}
    for i, o in enumerate(objects):
        with Image.open(io.BytesIO(data[o.key])) as img:
            want[i] = img.size[::-1]
    for upright in (False, True):
        store.requests.clear()
        cache = ObjectCache(tmp_path / str(upright))
        heads = CacheHeads(cache)
        counters = Counters()
        found, failed = asyncio.run(
            read_headers(store, objects, counters, heads, stays=every_one, upright=upright)
        )
        expected = dict(want)
        if upright:  # b.webp and g.png are tagged 6 and 8: turned, width and height swap
            expected[1], expected[6] = want[1][::-1], want[6][::-1]
        assert found == expected and failed == {}
        # One read each for the WebPs (their first 30 bytes), the AVIF (its meta box), the
        # JPEG and the PNGs as stored; upright, the PNGs' and b.webp's last 64 KiB too;
        # the TIFF read whole.
        reads = {"a.webp": 1, "b.webp": 1, "c.avif": 1, "d.tif": 2, "e.png": 1, "f.jpg": 1}
        reads["g.png"] = 1
        if upright:
            reads |= {"b.webp": 2, "e.png": 2, "g.png": 2}
        assert counters.requests == store.requests["get"] == sum(reads.values())
        assert counters.bytes_fetched < sum(map(len, data.values())) * 0.8  # little besides
        kept = {"d.tif", "f.jpg"}  # read whole: the cache keeps them
        assert {k.split("\x00")[1] for k in cache.entry_keys()} == kept
        # The next pass reads those in the cache, the others from the store again.
        again = Counters()
        found, _ = asyncio.run(
            read_headers(store, objects, again, heads, stays=every_one, upright=upright)
        )
        assert found == expected
        assert again.requests == sum(n for k, n in reads.items() if k not in kept)
        cache.close()


def test_an_orientation_after_the_pixels_is_read_at_the_object_s_end() -> None:
    """From a PNG's or a WebP's last bytes: its chunks there, as Pillow's load reads them
    (their CRCs, for a PNG; for a WebP, lengths that lead to its end); where the last
    bytes are not its end, or not its chunks, the upright size stays unknown."""
    late = late_exif_png(_noise(300, 200), 6)
    head, tail = late[:HEAD_BYTES], late[-HEAD_BYTES:]
    assert header_sizes(head) == ((200, 300), None)
    assert header_sizes(head, tail=tail) == ((200, 300), (300, 200))
    assert header_sizes(head, tail=tail[:-5]) == ((200, 300), None)  # not its end
    plain = _saved(_noise(300, 200), "PNG")  # no EXIF anywhere: upright as stored
    assert header_sizes(plain[:HEAD_BYTES], tail=plain[-HEAD_BYTES:]) == ((200, 300),) * 2
    # The chunk's type in the pixels by chance, its CRC wrong: not taken.
    fake = b"\x00\x00\x00\x10eXIf" + bytes(20)
    assert header_sizes(head, tail=fake + plain[-100:]) == ((200, 300),) * 2
    webp = _saved(_noise(300, 200), "WEBP", 6, lossless=True)
    head, tail = webp[:HEAD_BYTES], webp[-HEAD_BYTES:]
    assert header_sizes(head) == ((200, 300), None)
    assert header_sizes(head, tail=tail) == ((200, 300), (300, 200))
    assert header_sizes(head, tail=b"EXIF" + tail) == ((200, 300), (300, 200))  # by chance
    assert header_sizes(head, tail=tail[:-1]) == ((200, 300), None)  # not its end
