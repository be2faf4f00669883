"""A realistic JPEG folder for the demo, tests and benchmarks, made from real photos.

The two photos shipped in scikit-learn's wheel (``china.jpg``, ``flower.jpg``) are cut
into random crops, rescaled to ImageNet-like sizes (shorter side 320–460 px, aspect 3:4 to
16:9), colour-jittered, given a little grain, and saved as JPEG at quality 92–96, ~105 KB
and ~210 kilopixels per file on average, in an ImageFolder layout
(``class_XX/img_XXXXX.jpg``).  Generation is deterministic per seed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from PIL import Image, ImageEnhance

if TYPE_CHECKING:
    from ._azurite import Azurite
    from ._servers import MotoServer

__all__ = [
    "DEMO_DIR",
    "DemoBucket",
    "demo_bucket",
    "make_jpeg",
    "make_jpeg_folder",
    "source_photos",
]

DEMO_DIR = os.path.join("cache", "demo-jpegs")


def source_photos() -> list[Image.Image]:
    """The real photos the dataset is derived from."""
    # Located, not imported: importing sklearn.datasets takes over a second.
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the demo data is derived from scikit-learn's sample photos: "
            "pip install 'asyncloader[demo]'"
        )
    folder = Path(spec.origin).parent / "datasets" / "images"
    return [Image.open(folder / name).convert("RGB") for name in ("china.jpg", "flower.jpg")]


def make_jpeg(photos: list[Image.Image], seed: int, size: tuple[int, int] | None = None) -> bytes:
    """One ImageNet-like JPEG from a random crop of one of ``photos``; ``size``: (width,
    height) instead of an ImageNet-like size (a camera's 4000×3000, say)."""
    rng = random.Random(seed)
    src = photos[rng.randrange(len(photos))]
    sw, sh = src.size
    short = rng.randint(320, 460)
    aspect = rng.uniform(0.75, 1.78)
    out_w, out_h = (round(short * aspect), short) if aspect >= 1 else (short, round(short / aspect))
    if size is not None:
        out_w, out_h = size
    # A crop of 60–100 % of the source with the output's aspect ratio.
    frac = rng.uniform(0.6, 1.0)
    cw = min(sw, round(sw * frac))
    ch = min(sh, round(cw * out_h / out_w))
    cw = min(cw, round(ch * out_w / out_h))
    left, top = rng.randint(0, sw - cw), rng.randint(0, sh - ch)
    img = src.resize((out_w, out_h), Image.Resampling.BICUBIC, box=(left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    img = ImageEnhance.Color(img).enhance(rng.uniform(0.6, 1.4))
    img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.75, 1.25))
    img = ImageEnhance.Contrast(img).enhance(rng.uniform(0.8, 1.2))
    # Sensor-like grain, as in real photos (smooth upscaled crops compress unrealistically).
    grain = np.random.default_rng(seed).integers(-9, 10, size=(out_h, out_w, 1), dtype=np.int16)
    img = Image.fromarray(np.clip(np.asarray(img, np.int16) + grain, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=rng.randint(92, 96))
    return buf.getvalue()


def make_jpeg_folder(
    root: str | os.PathLike[str], *, images: int = 2000, classes: int = 10, seed: int = 0
) -> Path:
    """Create (once) ``root`` with ``images`` JPEGs in ``classes`` class folders.

    A marker file records the parameters; an existing complete folder is reused.  Made
    again with other parameters, the folder keeps only the new set: JPEGs an earlier call
    made that are not part of it (more images, other classes) are removed.
    """
    root = Path(root)
    marker = root / ".complete.json"
    params = {"images": images, "classes": classes, "seed": seed, "version": 1}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return root
    photos = source_photos()
    root.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)

    def path_of(i: int) -> Path:
        return root / f"class_{i % classes:02d}" / f"img_{i:06d}.jpg"

    wanted = {path_of(i) for i in range(images)}
    for old in root.glob("class_*/img_*.jpg"):  # only names this function gives
        if old not in wanted:
            old.unlink()
    for folder in root.glob("class_*"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()

    def one(i: int) -> None:
        path = path_of(i)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(make_jpeg(photos, seed * 1_000_003 + i))

    with ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        list(ex.map(one, range(images)))
    marker.write_text(json.dumps(params))
    return root


class DemoBucket(NamedTuple):
    """Where the demo data is served: ``url``, the emulator's ``endpoint`` and ``pid``, its
    ``name`` and the ``store_options`` that reach it."""

    url: str
    endpoint: str
    pid: int
    name: str
    store_options: dict[str, Any]


@contextlib.contextmanager
def demo_bucket(
    data_dir: str | os.PathLike[str] = DEMO_DIR,
    *,
    images: int = 2000,
    classes: int = 10,
    seed: int = 0,
    store: str = "s3",
) -> Iterator[DemoBucket]:
    """The demo's data on a local emulator: yields a :class:`DemoBucket`.

    Generates the JPEG folder once under ``data_dir``, starts ``moto_server`` (``store="s3"``)
    or Azurite (``store="azure"``) on 127.0.0.1 and uploads the folder.  For S3 it sets the
    emulator's test credentials in the environment if none are set.
    """
    if store not in ("s3", "azure"):
        raise ValueError(f"store must be 's3' or 'azure', not {store!r}")
    from ._azurite import Azurite  # the emulators
    from ._servers import TEST_ENV, MotoServer

    make_jpeg_folder(data_dir, images=images, classes=classes, seed=seed)
    server: MotoServer | Azurite
    if store == "azure":
        server = Azurite()
    else:
        for k, v in TEST_ENV.items():
            os.environ.setdefault(k, v)
        server = MotoServer()
    with server:
        server.create_bucket("asyncloader-demo")
        server.upload_folder("asyncloader-demo", data_dir, "train/")
        assert server.pid is not None
        if isinstance(server, Azurite):
            yield DemoBucket(
                f"az://{server.account}/asyncloader-demo/train/",
                server.endpoint,
                server.pid,
                "Azurite",
                {"connection_string": server.connection_string},
            )
        else:
            yield DemoBucket(
                "s3://asyncloader-demo/train/",
                server.endpoint,
                server.pid,
                "moto_server",
                {"endpoint_url": server.endpoint},
            )
