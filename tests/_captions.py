"""A caption folder for the web servers' tests: JPEGs in three aspect ratios with a
``metadata.jsonl`` of captions and scores (Hugging Face's ``imagefolder``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

import asyncloader as al

SHAPES = [(60, 60), (40, 90), (90, 40)]  # height, width


def caption_folder(root: Path, kind: str = "jsonl") -> Path:
    """12 JPEGs in three aspect ratios (some in a subfolder) and a metadata file of
    captions and scores, in an order of its own: ``metadata.jsonl``, or (``kind``) its
    ``csv`` or ``parquet`` twin."""
    rows = []
    for i in reversed(range(12)):
        h, w = SHAPES[i % 3]
        name = f"sub/{i:02d}.jpg" if i % 4 == 0 else f"{i:02d}.jpg"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pixels = (np.random.default_rng(i).random((h, w, 3)) * 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        (root / name).write_bytes(buf.getvalue())
        rows.append({"file_name": name, "text": f"photo {i}", "score": i % 3})
    if kind == "csv":
        with open(root / "metadata.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), root / "metadata.parquet")
    else:
        (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def class_site(root: Path, jpeg_folder: Path) -> dict[str, int]:
    """Two class folders of the test photos, each photo with a ``.txt`` caption beside it,
    one name with a space, an ampersand and a non-ASCII letter, one longer than nginx's
    HTML pages show (50 characters: cut short, "..>"), two photos made thumbnails (below
    10,000 bytes: nginx writes their size whole however it rounds); each image's size by
    key."""
    sizes = {}
    for i, photo in enumerate(sorted(jpeg_folder.rglob("*.jpg"))[:8]):
        odd = {3: "a b&ü ", 6: "a long name " * 6}.get(i, "")
        name = f"{'cat' if i % 2 else 'dog'}/{odd}{i}.jpg"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        if i in (0, 5):
            with Image.open(photo) as img:
                img.resize((64, 48)).save(root / name, "JPEG", quality=80)
        else:
            (root / name).write_bytes(photo.read_bytes())
        (root / name).with_suffix(".txt").write_text(f"photo {i}")
        sizes[name] = (root / name).stat().st_size
    return sizes


def class_epoch(
    url: str, cut: int, cache: Path
) -> tuple[dict[str, str], tuple[str, ...], al.Stats]:
    """One epoch over :func:`class_site` served at ``url``, filtered to the images under
    ``cut`` bytes, through the cache folder ``cache``: each caption's class name, the
    classes, the run's stats."""
    with al.ImageLoader(
        url,
        batch_size=2,
        transform=al.Resize(24),
        filters=[("size", "<", cut)],
        extras=("txt",),
        cache_dir=cache,
    ) as loader:
        got = {}
        for _, labels, extras in loader:
            for label, text in zip(labels.tolist(), extras["txt"], strict=True):
                got[text] = loader.classes[label]
        return got, loader.classes, loader.stats()


def class_captions(kept: set[str]) -> dict[str, str]:
    """What :func:`class_epoch` gives for the images ``kept`` (their keys)."""
    return {f"photo {k.split('/')[1].split()[-1][:-4]}": k.split("/")[0] for k in kept}


def class_cut(root: Path, jpeg_folder: Path) -> tuple[dict[str, int], int, set[str]]:
    """:func:`class_site` in ``root``: each image's size by key, a size that cuts them in
    halves, and the keys of the smaller half (those a filter ``size < cut`` keeps)."""
    sizes = class_site(root, jpeg_folder)
    cut = sorted(sizes.values())[len(sizes) // 2]
    return sizes, cut, {k for k, size in sizes.items() if size < cut}


BUCKETS = [(64, 64), (48, 96), (96, 48)]
WIDE = {f"photo {i}": SHAPES[i % 3] for i in range(12) if SHAPES[i % 3][1] >= 60}
"""The captions and sizes of :func:`caption_folder`'s images at least 60 pixels wide."""


def wide_epoch(url: str, cache: Path) -> tuple[dict[str, tuple[int, int]], al.Stats]:
    """One epoch over :func:`caption_folder` served at ``url`` in :data:`BUCKETS`, filtered
    on the headers' width (``width >= 60``; batches of one: no leftover), through the cache
    folder ``cache``: each caption's ``original_size`` (every batch one bucket's shape), the
    run's stats."""
    with al.ImageLoader(
        url,
        batch_size=1,
        buckets=BUCKETS,
        filters=[("width", ">=", 60)],
        extras=("text", "original_size"),
        cache_dir=cache,
        labels=None,
    ) as loader:
        got = {}
        for images, _, extras in loader:
            assert tuple(images.shape[2:]) in BUCKETS
            got[extras["text"][0]] = tuple(extras["original_size"][0])
        return got, loader.stats()
