"""A text-to-image step on aspect-ratio buckets, streamed from S3: a tiny denoiser learns to
predict the noise added to each image, conditioned on its caption and, as SDXL is, on its
original size and crop corner.

The folder holds photos in three aspect ratios (the demo's JPEGs, cut to 1:1, 3:2 and 2:3)
with a ``metadata.jsonl`` of captions and an aesthetic score, and no width or height: the
loader reads each kept image's header once (one small range request) and keeps the sizes
for the next run. ``filters=`` leaves the low scores out before anything is fetched;
``buckets=`` sends each image to the bucket nearest its shape, every batch one bucket; the
extras bring the captions, ``original_size`` and ``crop_top_left``.

python examples/train_text_to_image.py --steps 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import zlib
from pathlib import Path

import torch
from PIL import Image
from torch import nn

import asyncloader as al
from asyncloader.testing import TEST_ENV, MotoServer, make_jpeg_folder

WORDS = 4096  # hashed vocabulary of the text encoder
SHAPES = ((1, 1), (2, 3), (3, 2))  # height:width of the folder's photos
COLOURS = ("red", "green", "blue", "amber", "violet", "grey", "white", "black", "pink", "teal")


def shaped_folder(root: Path, images: int) -> Path:
    """The demo's JPEGs in ``root``, each cut to one of :data:`SHAPES`, with a
    ``metadata.jsonl``: a caption and an aesthetic score (0-9) per image."""
    source = make_jpeg_folder(root / "demo", images=images)
    out = root / "photos"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, path in enumerate(sorted(source.glob("class_*/img_*.jpg"))):
        cls = int(path.parent.name.split("_")[1])
        h, w = SHAPES[i % len(SHAPES)]
        with Image.open(path) as img:
            side = min(img.size)
            cut = img.crop((0, 0, side * w // max(h, w), side * h // max(h, w)))
            cut.convert("RGB").save(out / f"{i:05d}.jpg", quality=90)
        caption = f"a {COLOURS[cls % len(COLOURS)]} photo of kind {cls}"
        rows.append({"file_name": f"{i:05d}.jpg", "text": caption, "aesthetic": (i * 7) % 10})
    (out / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def tokens(captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Hashed words and offsets for ``nn.EmbeddingBag``."""
    ids: list[int] = []
    offsets: list[int] = []
    for caption in captions:
        offsets.append(len(ids))
        ids += [zlib.crc32(w.encode()) % WORDS for w in caption.lower().split()]
    return torch.tensor(ids), torch.tensor(offsets)


def fourier(values: torch.Tensor, dim: int = 16) -> torch.Tensor:
    """SDXL's embedding of its size conditions: sines and cosines of each number."""
    freqs = torch.exp(-math.log(10000) * torch.arange(dim // 2) / (dim // 2))
    angles = values[..., None].float() * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(1)


class Denoiser(nn.Module):
    """Fully convolutional, so any bucket's shape goes through; the caption and the size
    conditions shift its features (FiLM)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.text = nn.EmbeddingBag(WORDS, dim)
        self.sizes = nn.Linear(4 * 16 + 1, dim)  # original size, crop corner, noise level
        self.inp = nn.Conv2d(3, dim, 3, padding=1)
        self.mid = nn.Conv2d(dim, dim, 3, padding=1)
        self.out = nn.Conv2d(dim, 3, 3, padding=1)

    def forward(
        self, noisy: torch.Tensor, level: torch.Tensor, captions: list[str], sizes: torch.Tensor
    ) -> torch.Tensor:
        cond = self.text(*tokens(captions)) + self.sizes(torch.cat([fourier(sizes), level], 1))
        h = nn.functional.silu(self.inp(noisy)) + cond[:, :, None, None]
        return self.out(nn.functional.silu(self.mid(h)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--images", type=int, default=240)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--data-dir", default="cache/text-to-image")
    args = p.parse_args()
    folder = shaped_folder(Path(args.data_dir), args.images)
    for k, v in TEST_ENV.items():  # the emulator's own credentials
        os.environ.setdefault(k, v)
    torch.manual_seed(0)
    model = Denoiser()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    # Buckets of about 64 × 64 pixels, from 1:2 to 2:1 (SDXL's are about 1024 × 1024).
    buckets = al.make_buckets(64 * 64, ratios=(0.5, 2.0), step=16, hflip=True)
    with MotoServer() as server:
        server.create_bucket("photos")
        server.upload_folder("photos", folder, "train/")
        with al.ImageLoader(
            "s3://photos/train/",
            batch_size=args.batch_size,
            labels=None,
            buckets=buckets,
            filters=[("aesthetic", ">=", 3)],
            extras=("text", "original_size", "crop_top_left"),
            cache_dir=str(Path(args.data_dir) / "cache"),
            device="cpu",  # float32 in [0, 1]
            store=al.StoreConfig(options={"endpoint_url": server.endpoint}),
        ) as loader:
            step, epoch, shapes = 0, 0, set()
            while step < args.steps:
                loader.set_epoch(epoch)
                for images, _, extras in loader:  # type: ignore[misc]
                    x = images * 2 - 1
                    level = torch.rand(len(x), 1)
                    noise = torch.randn_like(x)
                    a = (1 - level)[:, :, None, None]
                    noisy = a.sqrt() * x + (1 - a).sqrt() * noise
                    sizes = torch.tensor(
                        [
                            [*o, *c]
                            for o, c in zip(
                                extras["original_size"], extras["crop_top_left"], strict=True
                            )
                        ]
                    )
                    loss = nn.functional.mse_loss(model(noisy, level, extras["text"], sizes), noise)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    step += 1
                    shapes.add(tuple(images.shape[2:]))
                    if step % 5 == 0 or step == args.steps:
                        print(
                            f"step {step} epoch {epoch} bucket {images.shape[2]}x{images.shape[3]} "
                            f"loss {loss.item():.3f}"
                        )
                    if step == args.steps:
                        break
                epoch += 1
            print(f"buckets seen: {sorted(shapes)}")
            print(loader.stats().summary())


if __name__ == "__main__":
    main()
