"""A caption folder for the web servers' tests: JPEGs in three aspect ratios with a
``metadata.jsonl`` of captions and scores (Hugging Face's ``imagefolder``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

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
