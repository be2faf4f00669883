"""Images with captions beside them, streamed from S3 into a small CLIP-style step.

The folder holds the demo's JPEGs and a ``metadata.jsonl`` at its root (Hugging Face's
imagefolder convention: ``file_name`` and a ``caption`` per image); ``extras=("caption",)``
delivers each batch's captions beside its images, in batch order.  A tiny image encoder and
a bag-of-words text encoder learn to match them (a contrastive loss over the batch).

python examples/train_captions.py --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import zlib
from pathlib import Path

import torch
from torch import nn

import asyncloader as al
from asyncloader.testing import TEST_ENV, MotoServer, make_jpeg_folder

WORDS = 4096  # hashed vocabulary of the text encoder
COLOURS = ("red", "green", "blue", "amber", "violet", "grey", "white", "black", "pink", "teal")


def captioned_folder(root: Path, images: int) -> Path:
    """The demo's JPEGs in ``root`` with a ``metadata.jsonl`` captioning each one."""
    make_jpeg_folder(root, images=images)
    rows = []
    for path in sorted(root.glob("class_*/img_*.jpg")):
        cls = int(path.parent.name.split("_")[1])
        name = path.relative_to(root).as_posix()
        caption = f"a {COLOURS[cls % len(COLOURS)]} photo of kind {cls}"
        rows.append(json.dumps({"file_name": name, "caption": caption}))
    (root / "metadata.jsonl").write_text("\n".join(rows) + "\n")
    return root


def tokens(captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Hashed words and offsets for ``nn.EmbeddingBag``."""
    ids: list[int] = []
    offsets: list[int] = []
    for caption in captions:
        offsets.append(len(ids))
        ids += [zlib.crc32(w.encode()) % WORDS for w in caption.lower().split()]
    return torch.tensor(ids), torch.tensor(offsets)


class Clip(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.image = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, dim, 3, stride=2, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.text = nn.EmbeddingBag(WORDS, dim)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        img = nn.functional.normalize(self.image(images), dim=1)
        txt = nn.functional.normalize(self.text(*tokens(captions)), dim=1)
        logits = img @ txt.T * self.scale.exp()
        target = torch.arange(len(captions))
        ce = nn.functional.cross_entropy
        return (ce(logits, target) + ce(logits.T, target)) / 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--data-dir", default="cache/captions")
    args = p.parse_args()
    folder = captioned_folder(Path(args.data_dir), args.images)
    for k, v in TEST_ENV.items():  # the emulator's own credentials
        os.environ.setdefault(k, v)
    model = Clip()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with MotoServer() as server:
        server.create_bucket("captions")
        server.upload_folder("captions", folder, "train/")
        with al.ImageLoader(
            "s3://captions/train/",
            batch_size=args.batch_size,
            transform=al.RandomResizedCrop(64),
            extras=("caption",),
            device="cpu",
            shard=al.ShardConfig(drop_last=True),
            store=al.StoreConfig(
                options={"endpoint_url": server.endpoint}
            ),  # normalised float32 batches
        ) as loader:
            step, epoch = 0, 0
            while step < args.steps:
                loader.set_epoch(epoch)
                for images, _labels, extras in loader:  # type: ignore[misc]
                    loss = model(images, extras["caption"])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    step += 1
                    if step == 1:
                        print(f"first caption: {extras['caption'][0]!r}")
                    if step % 5 == 0 or step == args.steps:
                        print(f"step {step} epoch {epoch} loss {loss.item():.3f}")
                    if step == args.steps:
                        break
                epoch += 1
            print(loader.stats().summary())


if __name__ == "__main__":
    main()
