"""Aspect-ratio buckets (``buckets=``): each image to the bucket nearest its aspect ratio,
resized to cover it and cropped to it; every batch one bucket ``[B, 3, h, w]``; the
epoch's batches made from the seed and the epoch alone (what a bucket leaves over is left
out), ranks taking whole batches, resume and elastic resume exact; sizes from the metadata
file or one header read per object, kept for the next run; ``original_size`` and
``crop_top_left`` as extras; the pixels Pillow's resize of the same box."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._base._config import RunConfig, ShardConfig
from asyncloader._dataset._located import read_manifest_file
from asyncloader._decode._image import DecodeSpec, decode_into
from asyncloader._decode._transforms import bucket_plan
from asyncloader._run._resume import loader_state, plan_resume
from asyncloader._run._sampler import bucketed, consumed_prefix, epoch_indices
from asyncloader.testing import FaultProxy, MotoServer, bucket_reference

from ._png import late_exif_png

# --- the buckets, the plan and the epoch's batches (pure) ---------------------------------


def test_make_buckets_is_sdxl_s_set() -> None:
    b = al.make_buckets(1024 * 1024)
    assert (1024, 1024) in b.sizes and (832, 1216) in b.sizes and (1216, 832) in b.sizes
    for h, w in b.sizes:
        assert h % 64 == 0 and w % 64 == 0 and h * w <= 1024 * 1024
        assert 0.25 <= w / h <= 4.0
    ratios = [w / h for h, w in b.sizes]
    assert ratios == sorted(ratios) and len(set(ratios)) == len(ratios)
    assert b.max_pixels == max(h * w for h, w in b.sizes)
    with pytest.raises(ValueError, match="no buckets"):
        al.make_buckets(100, step=64)


@pytest.mark.parametrize(
    ("sizes", "says"),
    [((), "at least one"), (((0, 10),), "whole pixels"), (((10, 10), (10, 10)), "twice")],
)
def test_bad_buckets_are_refused(sizes: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        al.Buckets(sizes)


def test_a_set_made_by_make_buckets_takes_another_crop() -> None:
    made = al.make_buckets(512 * 512, ratios=(0.5, 2.0))
    centred = al.Buckets(made, crop="center", hflip=True)
    assert centred.sizes == made.sizes and centred.crop == "center" and centred.hflip
    assert centred.describe() != made.describe()  # another crop: another resume state


@pytest.mark.parametrize("extras", [("original_size",), ("text", "crop_top_left")])
def test_the_crop_s_geometry_without_buckets_is_refused_by_name(extras: tuple[str, ...]) -> None:
    """``original_size`` and ``crop_top_left`` are a bucketed run's: asked without buckets,
    the options are refused before anything starts, naming them (not a failed pipeline)."""
    with pytest.raises(ValueError, match=f"extras '{extras[-1]}'.*buckets="):
        RunConfig(batch_size=4, extras=extras)
    RunConfig(batch_size=4, extras=extras, buckets=al.Buckets(((8, 8),)))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(8, 512), st.integers(8, 512)), min_size=1, max_size=6, unique=True
    ),
    st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 4000)), min_size=1, max_size=20),
)
def test_each_image_goes_to_the_nearest_bucket_on_a_log_scale(
    sizes: list[tuple[int, int]], images: list[tuple[int, int]]
) -> None:
    b = al.Buckets(tuple(sizes))
    got = b.nearest([h for h, _ in images], [w for _, w in images])
    for (h, w), k in zip(images, got.tolist(), strict=True):
        dist = [abs(math.log(w / h) - math.log(bw / bh)) for bh, bw in sizes]
        assert dist[k] <= min(dist) + 1e-12
        assert k == dist.index(min(dist)) or abs(dist[k] - min(dist)) < 1e-12


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 3000),
    st.integers(1, 3000),
    st.tuples(st.integers(1, 600), st.integers(1, 600)),
    st.integers(0, 2**32),
    st.sampled_from(["random", "center"]),
)
def test_a_bucket_plan_covers_the_bucket_from_inside_the_image(
    width: int, height: int, size: tuple[int, int], seed: int, crop: str
) -> None:
    plan, (top, left) = bucket_plan(width, height, size, random.Random(seed), crop=crop)
    bh, bw = size
    assert plan.size == (bw, bh)
    x0, y0, x1, y1 = plan.box
    assert -1e-9 <= x0 < x1 <= width + 1e-9 and -1e-9 <= y0 < y1 <= height + 1e-9
    scale = max(bw / width, bh / height)
    rw, rh = max(bw, round(width * scale)), max(bh, round(height * scale))
    assert 0 <= left <= rw - bw and 0 <= top <= rh - bh
    if crop == "center":
        assert (top, left) == ((rh - bh) // 2, (rw - bw) // 2)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(24, 400),
    st.integers(24, 400),
    st.tuples(st.integers(8, 160), st.integers(8, 160)),
    st.integers(0, 2**32),
    st.sampled_from(["random", "center"]),
)
def test_the_documented_geometry_is_the_decode_bit_for_bit(
    width: int, height: int, size: tuple[int, int], seed: int, crop: str
) -> None:
    """docs/data.md's formula, written out from ``original_size`` and ``crop_top_left``
    alone: resized by ``s``, rounded, the box in source pixels (scaled as Pillow's
    ``draft`` scales the decode where the JPEG is twice the size or more) — Pillow's
    resize of it is the decoded sample exactly."""
    bh, bw = size
    rng = np.random.default_rng(seed % 1000)
    small = (rng.random((height // 4 + 1, width // 4 + 1, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR).save(buf, "JPEG")
    data = buf.getvalue()
    spec = DecodeSpec((3, bh, bw), buckets=al.Buckets((size,), crop=crop))
    out = np.zeros((3, bh, bw), np.uint8)
    decode_into(data, out, spec, seed, "k", mark=(bh, bw, height, width))
    _, corner = bucket_plan(width, height, size, random.Random(seed), crop=crop)
    img, box, _ = bucket_reference(data, size, corner)
    ref = img.resize((bw, bh), Image.Resampling.BILINEAR, box=box)
    assert np.array_equal(out, np.asarray(ref).transpose(2, 0, 1))


def _kinds() -> dict[str, bytes]:
    """One image of each kind a caption folder holds, in two aspect ratios: grayscale,
    CMYK and progressive JPEGs, PNGs with alpha, a palette, gray with alpha and 16-bit
    gray, WebP (lossy, and lossless with alpha), GIF, BMP, TIFF, a thumbnail smaller than
    any bucket and a strip far outside the buckets' ratios."""
    rng = np.random.default_rng(7)

    def rgb(w: int, h: int) -> Image.Image:
        return Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))

    def saved(img: Image.Image, fmt: str, **kw: Any) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    sixteen = Image.fromarray((rng.random((200, 300)) * 65535).astype(np.uint16))
    return {
        "gray.jpg": saved(rgb(300, 200).convert("L"), "JPEG"),
        "cmyk.jpg": saved(rgb(200, 300).convert("CMYK"), "JPEG"),
        "progressive.jpg": saved(rgb(300, 300), "JPEG", progressive=True),
        "rgba.png": saved(rgb(300, 200).convert("RGBA"), "PNG"),
        "palette.png": saved(rgb(200, 300).convert("P"), "PNG"),
        "la.png": saved(rgb(300, 200).convert("LA"), "PNG"),
        "sixteen.png": saved(sixteen, "PNG"),
        "lossy.webp": saved(rgb(300, 200), "WEBP", quality=90),
        "alpha.webp": saved(rgb(200, 300).convert("RGBA"), "WEBP", lossless=True),
        "palette.gif": saved(rgb(300, 200).convert("P"), "GIF"),
        "plain.bmp": saved(rgb(300, 300), "BMP"),
        "plain.tif": saved(rgb(200, 300), "TIFF"),
        "thumbnail.jpg": saved(rgb(10, 7), "JPEG"),
        "strip.jpg": saved(rgb(1000, 50), "JPEG"),
    }


@pytest.mark.parametrize("crop", ["random", "center"])
def test_every_kind_of_image_is_the_reference_s_pixels(crop: str) -> None:
    """Each kind of image, in the bucket nearest its shape, decodes to the reference's
    pixels (:func:`asyncloader.testing.bucket_reference`, Pillow's alone): colour modes,
    alpha, palettes, 16-bit gray (by its high byte, docs/data.md), other formats, an image
    smaller than its bucket, one far outside the buckets' ratios."""
    buckets = al.Buckets(al.make_buckets(128 * 128, ratios=(0.5, 2.0), step=32).sizes, crop=crop)
    for i, (name, data) in enumerate(_kinds().items()):
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
        bh, bw = buckets.sizes[int(buckets.nearest([height], [width])[0])]
        spec = DecodeSpec((3, bh, bw), buckets=buckets)
        out = np.zeros((3, bh, bw), np.uint8)
        decode_into(data, out, spec, i, name, mark=(bh, bw, height, width))
        _, corner = bucket_plan(width, height, (bh, bw), random.Random(i), crop=crop)
        img, box, _ = bucket_reference(data, (bh, bw), corner)
        ref = img.resize((bw, bh), Image.Resampling.BILINEAR, box=box)
        assert np.array_equal(out, np.asarray(ref).transpose(2, 0, 1)), name


def _one_bucket_each(
    order: np.ndarray, marked: np.ndarray, buckets: np.ndarray, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bucketed`'s epoch (``marked``: each sample's bucket, as it takes them) and its
    batches, each sample at most once and every batch of one bucket (``buckets``)."""
    out = bucketed(order, marked, batch_size)
    assert len(out) % batch_size == 0 and len(set(out.tolist())) == len(out)
    blocks = out.reshape(-1, batch_size)
    for block in blocks:
        assert len(set(buckets[block].tolist())) == 1
    return out, blocks


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=0, max_size=60),
    st.integers(1, 5),
    st.integers(0, 1000),
)
def test_the_epoch_s_batches_hold_one_bucket_each_and_each_sample_once(
    bucket_of: list[int], batch_size: int, seed: int
) -> None:
    buckets = np.asarray(bucket_of, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(buckets)).astype(np.int64)
    out, blocks = _one_bucket_each(order, buckets, buckets, batch_size)
    # Per bucket: its first samples in the order, as many full batches as it fills.
    for k, count in Counter(bucket_of).items():
        mine = [int(i) for i in order if buckets[i] == k]
        kept = [int(i) for i in out if buckets[i] == k]
        assert kept == mine[: count // batch_size * batch_size]
    # A batch goes out where its last sample stood: in that order.
    place = {int(i): p for p, i in enumerate(order)}
    ends = [max(place[int(i)] for i in block) for block in blocks]
    assert ends == sorted(ends)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=0, max_size=60),
    st.lists(st.booleans(), min_size=60, max_size=60),
    st.integers(1, 5),
    st.integers(0, 1000),
)
def test_samples_of_unknown_size_go_first_in_their_bucket_spread_never_left_over(
    bucket_of: list[int], unknown: list[bool], batch_size: int, seed: int
) -> None:
    """An image whose header could not be read (under on_error="skip"), marked ``~k``,
    joins bucket ``k`` before its samples of known size, spread over the bucket's full
    batches: it is in the epoch's batches (read, and counted as skipped) whenever the
    bucket has room for it there, never in what the bucket leaves over; the samples of
    known size keep :func:`bucketed`'s rule."""
    buckets = np.asarray(bucket_of, dtype=np.int64)
    marked = np.where(unknown[: len(buckets)], ~buckets, buckets)
    order = np.random.default_rng(seed).permutation(len(buckets)).astype(np.int64)
    out, blocks = _one_bucket_each(order, marked, buckets, batch_size)
    for k, count in Counter(bucket_of).items():
        theirs = [int(i) for i in order if marked[i] == ~k]
        mine = [int(i) for i in order if marked[i] == k]
        full = count // batch_size * batch_size
        u = min(len(theirs), full)
        assert [int(i) for i in out if marked[i] == ~k] == theirs[:u]
        assert [int(i) for i in out if marked[i] == k] == mine[: full - u]
        # Spread: the bucket's batches differ by at most one in their count of them.
        per = [int((marked[block] < 0).sum()) for block in blocks if buckets[block[0]] == k]
        assert not per or max(per) - min(per) <= 1
    # A batch goes out where its last sample of known size stood; one of unknown sizes
    # alone, at the epoch's start.
    place = {int(i): p if marked[i] >= 0 else -1 for p, i in enumerate(order)}
    ends = [max(place[int(i)] for i in block) for block in blocks]
    assert ends == sorted(ends)


LAYOUTS = (
    st.lists(st.integers(0, 2), min_size=1, max_size=80),  # each sample's bucket
    st.integers(1, 4),  # batch size
    st.integers(1, 4),  # ranks before
    st.integers(1, 4),  # ranks after
    st.sampled_from(["pad", "drop"]),
    st.integers(0, 5),  # batches taken before
)


@settings(max_examples=200, deadline=None)
@given(*LAYOUTS)
def test_ranks_take_whole_batches_and_an_elastic_resume_deals_the_rest(
    bucket_of: list[int], batch_size: int, old: int, new: int, even: str, taken: int
) -> None:
    """Rank r takes batches r, r + world, …; after ``taken`` batches a rank on ``old``
    ranks, ``new`` ranks dealing the rest of the order deliver exactly its other batches."""
    n = len(bucket_of)
    buckets = (np.asarray(bucket_of, dtype=np.int64), batch_size)
    kw: dict[str, Any] = {"seed": 3, "epoch": 1, "shuffle": True, "even": even, "buckets": buckets}
    whole = bucketed(
        epoch_indices(n, seed=3, epoch=1, shuffle=True), buckets[0], batch_size
    ).reshape(-1, batch_size)
    ranks = [
        epoch_indices(n, rank=r, world_size=old, **kw).reshape(-1, batch_size) for r in range(old)
    ]
    assert len({len(r) for r in ranks}) == 1  # the same count on every rank
    for r, got in enumerate(ranks):
        for b, block in enumerate(got):
            g = b * old + r
            if g < len(whole):
                assert block.tolist() == whole[g].tolist()
    if even == "drop":
        assert sum(len(r) for r in ranks) == len(whole) - len(whole) % old
    taken = min(taken, len(ranks[0]))
    start = consumed_prefix(taken, batch_size, old, 0, len(whole) * batch_size)
    rest = [
        epoch_indices(n, rank=r, world_size=new, start=start, end=None, **kw) for r in range(new)
    ]
    assert len({len(r) for r in rest}) == 1
    left = whole.reshape(-1)[start:].tolist()
    delivered = [i for r in rest for i in r.tolist()]
    if even == "pad":
        assert set(delivered) == set(left)
    else:
        assert set(delivered) <= set(left) and len(delivered) == len(set(delivered))
        assert len(left) - len(delivered) < new * batch_size


Row = tuple[int, ...]


@settings(max_examples=300, deadline=None)
@given(*LAYOUTS, st.integers(0, 4))
def test_a_bucketed_state_resumes_on_any_world_the_rest_the_run_would_deal(
    bucket_of: list[int], batch_size: int, old: int, new: int, even: str, taken: int, again: int
) -> None:
    """The state a bucketed rank saves after ``taken`` batches resumes on ``new`` ranks with
    the batches the ``old`` ranks had still to deal — whole batches, never one that their
    even rule left out — and a state saved on the new layout ``again`` batches later
    resumes on the old one with the rest of that."""
    n = len(bucket_of)
    order = (np.asarray(bucket_of, dtype=np.int64), batch_size)
    kw: dict[str, Any] = {"seed": 3, "epoch": 1, "shuffle": True, "even": even, "buckets": order}

    def run(world: int) -> RunConfig:
        shard = ShardConfig(even=even)  # type: ignore[arg-type]
        return RunConfig(
            batch_size=batch_size, seed=3, world_size=world, shard=shard, buckets=BUCKETS
        )

    def rows(world: int, span: tuple[int, int] | None) -> list[list[Row]]:
        """Each rank's batches, dealing ``span`` of the order (None: all of it)."""
        start, end = span or (0, None)
        return [
            [
                tuple(b)
                for b in epoch_indices(n, rank=r, world_size=world, start=start, end=end, **kw)
                .reshape(-1, batch_size)
                .tolist()
            ]
            for r in range(world)
        ]

    def resume(world: int, at: int, span: tuple[int, int] | None, to: int) -> Any:
        """Where ``to`` ranks go on from the state of ``world`` ranks at batch ``at``."""
        dealt = len(rows(world, span)[0]) * batch_size * world
        state = loader_state(
            run(world), epoch=1, next_batch=at, num_objects=n, span=span, dealt=dealt
        )
        fresh = loader_state(run(to), epoch=0, next_batch=0, num_objects=n, dealt=0)
        return plan_resume(state, fresh)

    first = rows(old, None)
    every = {b for mine in first for b in mine}
    taken = min(taken, len(first[0]))
    left = {b for mine in first for b in mine[taken:]} - {b for mine in first for b in mine[:taken]}
    plan = resume(old, taken, None, new)
    if plan.epoch != 1:
        assert not left  # nothing left of the epoch
        return
    rest = [mine[plan.next_batch :] for mine in rows(new, plan.span)]  # (the same layout)
    assert len({len(mine) for mine in rest}) == 1
    got = [b for mine in rest for b in mine]
    if even == "pad":  # (and repeats of the epoch's batches, to even the last round)
        assert left <= set(got) <= every
    else:  # never a batch the old ranks left out; at most the new ranks' last round less
        assert set(got) <= left and len(got) == len(set(got))
        assert len(left) - len(got) < new
    # Saved on the new layout `again` batches later, resumed on the old one.
    again = min(again, len(rest[0]))
    seen = {b for mine in rest for b in mine[:again]}
    plan2 = resume(new, plan.next_batch + again, plan.span, old)
    if plan2.epoch != 1:
        assert seen == set(got)
        return
    final = {b for mine in rows(old, plan2.span) for b in mine[plan2.next_batch :]}
    if even == "pad":
        assert set(got) - seen <= final <= every
    else:
        assert final <= set(got) - seen


def test_merged_worker_states_of_a_bucketed_rank_end_at_whole_batches() -> None:
    """A rank resumed elastically deals 5 batches of 2 (positions 4 to 14) to 3 ranks under
    "drop": they deal 3 of them, so its state ends at position 10, also once its 2
    DataLoader workers' states are merged with a batch delivered after the snapshot."""
    shard = ShardConfig(even="drop", num_workers=2)
    states = [
        loader_state(
            RunConfig(
                batch_size=2,
                world_size=3,
                shard=dataclasses.replace(shard, worker=w),
                buckets=BUCKETS,
            ),
            epoch=0,
            next_batch=1,
            num_objects=30,
            span=(4, 14),
        )
        for w in range(2)
    ]
    assert states[0]["end"] == 10
    merged = al.merge_worker_states(states, later_batches=1)
    assert (merged["start"], merged["end"], merged["consumed"]) == (4, 10, 10)


# --- from moto: shapes, requests, pixels, extras, resume ----------------------------------

SHAPES = [(60, 60), (40, 90), (90, 40)]  # height, width: 1:1, 9:4, 4:9
BUCKETS = al.Buckets(((32, 32), (24, 48), (48, 24)))
N = 30


def _jpeg(i: int) -> bytes:
    h, w = SHAPES[i % 3]
    pixels = (np.random.default_rng(i).random((h, w, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _score(i: int) -> int:
    return i % 5


def put_shapes(server: Any, bucket: str) -> None:
    """Two folders in ``bucket`` of ``N`` JPEGs each in three aspect ratios, with a
    ``metadata.jsonl`` of captions and scores (no width/height); ``b/`` has its objects'
    indices from ``N`` on.  ``server``: any test server with ``put(bucket, key, data)``."""
    for folder, base in (("a", 0), ("b", N)):
        rows = []
        for i in range(base, base + N):
            server.put(bucket, f"{folder}/{i:03d}.jpg", _jpeg(i))
            rows.append(
                {"file_name": f"{i:03d}.jpg", "idx": i, "text": f"t{i}", "score": _score(i)}
            )
        text = "".join(json.dumps(r) + "\n" for r in rows)
        server.put(bucket, f"{folder}/metadata.jsonl", text.encode())


@pytest.fixture(scope="module")
def shapes(moto: MotoServer) -> tuple[str, str]:
    """:func:`put_shapes` on moto: the bucket and moto's endpoint."""
    bucket = "shapes"
    moto.create_bucket(bucket)
    put_shapes(moto, bucket)
    return bucket, moto.endpoint


def _loader(url: Any, endpoint: str, **kw: Any) -> al.ImageLoader:
    kw.setdefault("engine", al.EngineConfig(mode="inline"))
    kw.setdefault("buckets", BUCKETS)
    kw.setdefault("extras", ("text", "original_size", "crop_top_left", "seed"))
    return al.ImageLoader(
        url,
        batch_size=3,
        labels="idx",
        filters=[("score", ">=", 1)],
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
        **kw,
    )


def _batches(
    loader: al.ImageLoader,
) -> list[tuple[tuple[int, ...], list[int], dict[str, Any], Any]]:
    return [(tuple(x.shape), y.tolist(), ex, x) for x, y, ex in loader]  # type: ignore[misc]


def test_bucketed_batches_from_moto_with_filters_and_header_reads(
    shapes: tuple[str, str], tmp_path: Path
) -> None:
    bucket, endpoint = shapes
    kept = [i for i in range(N) if _score(i) >= 1]
    with FaultProxy(endpoint) as proxy:
        with _loader(
            f"s3://{bucket}/a/",
            proxy.endpoint,
            cache_dir=str(tmp_path),
            seed=5,
            engine=al.EngineConfig(processes=2),
        ) as loader:
            got = _batches(loader)
            stats = loader.stats()
            assert len(loader) == len(got)
        first, headers = Counter(proxy.targets), Counter(proxy.ranges)
        with _loader(f"s3://{bucket}/a/", proxy.endpoint, cache_dir=str(tmp_path), seed=5) as again:
            assert [b[1] for b in _batches(again)] == [b[1] for b in got]
        second = Counter(proxy.ranges) - headers
    # Every batch one bucket; every kept sample at most once; per bucket, all but fewer
    # than a batch.
    seen = [i for _, labels, _, _ in got for i in labels]
    assert len(seen) == len(set(seen)) and set(seen) <= set(kept)
    for shape, labels, extras, _ in got:
        assert shape[0] == 3 and shape[1] == 3 and tuple(shape[2:]) in BUCKETS.sizes
        assert extras["text"] == [f"t{i}" for i in labels]
        assert extras["original_size"] == [SHAPES[i % 3] for i in labels]
    per_bucket = Counter(SHAPES[i % 3] for i in kept)
    for hw, count in per_bucket.items():
        delivered = sum(1 for i in seen if SHAPES[i % 3] == hw)
        assert count - 3 < delivered <= count and delivered % 3 == 0
    assert stats.filtered_out == N - len(kept)
    # No filtered-out object requested; one header read (a range request) per kept object,
    # which fetched it whole (these images are smaller than a header read): the cache kept
    # it, and the epoch read it there — one request per kept image in all.  In the second
    # run on the same node, no header read.
    for i in range(N):
        key = f"GET /{bucket}/a/{i:03d}.jpg"
        assert headers[key] == (1 if i in kept else 0), key
        assert first[key] == (1 if i in kept else 0), key
        assert second[key] == 0, key
    assert stats.cache_stored == len(kept) and stats.cache_hits == len(seen)
    # The pixels: Pillow's resize of the box the sample's seed draws, into its bucket.
    for shape, labels, extras, images in got[:3]:
        for j, i in enumerate(labels):
            h, w = SHAPES[i % 3]
            plan, corner = bucket_plan(w, h, shape[2:], random.Random(extras["seed"][j]))
            assert corner == tuple(extras["crop_top_left"][j])
            with Image.open(io.BytesIO(_jpeg(i))) as img:
                want = np.asarray(
                    img.convert("RGB").resize(plan.size, Image.Resampling.BILINEAR, box=plan.box)
                )
            assert np.array_equal(images[j].numpy().transpose(1, 2, 0), want), i


def test_buckets_that_leave_every_sample_over_say_so(tmp_path: Path) -> None:
    """No bucket fills one batch: the run stops at its start, saying what buckets leave
    out and how full the fullest is, not only "0 samples"."""
    for i in range(6):
        (tmp_path / f"{i}.jpg").write_bytes(_jpeg(i))  # two of each of the three shapes
    with (
        pytest.raises(ValueError, match=r"0 batches per epoch") as refused,
        al.ImageLoader(
            str(tmp_path),
            batch_size=3,
            labels=None,
            buckets=BUCKETS,
            engine=al.EngineConfig(mode="inline"),
        ) as loader,
    ):
        next(iter(loader))
    said = str(refused.value)
    assert "of the dataset's 6 samples, the fullest of its 3 buckets in use" in said, said
    assert "holds 2" in said and "smaller batch_size" in said


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_its_length_and_its_dataloader_workers_read_each_header_once(
    shapes: tuple[str, str], workers: int
) -> None:
    """Without a cache folder and outside any job: ``len()`` in the training process and
    the loaders it iterates (its own, or each DataLoader worker's) read each kept image's
    header once between them, through the dataset's own store."""
    from torch.utils.data import DataLoader

    from asyncloader.torch import ImageDataset

    bucket, endpoint = shapes
    kept = [i for i in range(N) if _score(i) >= 1]
    with FaultProxy(endpoint) as proxy:
        ds = ImageDataset(
            f"s3://{bucket}/a/",
            batch_size=3,
            labels="idx",
            seed=4,
            buckets=BUCKETS,
            filters=[("score", ">=", 1)],
            decode=al.DecodeConfig(workers=1),
            store=al.StoreConfig(options={"endpoint_url": proxy.endpoint}),
        )
        batches = len(ds)
        got = [y.tolist() for _, y in DataLoader(ds, batch_size=None, num_workers=workers)]
        ds.close()
        headers = Counter(proxy.ranges)
    for i in range(N):
        key = f"GET /{bucket}/a/{i:03d}.jpg"
        assert headers[key] == (1 if i in kept else 0), (key, workers)
    seen = [i for labels in got for i in labels]
    assert len(got) == batches and len(seen) == len(set(seen)) and set(seen) <= set(kept)


def test_throttled_reads_before_the_first_batch_are_retried(
    shapes: tuple[str, str], tmp_path: Path
) -> None:
    """What a bucketed, captioned run reads before its first batch — the metadata file,
    each image's header, a manifest — is retried when the store throttles (503 SlowDown)
    or fails on the way (500), as the images' own reads are: the run starts, every retry
    counted, none of it skipped."""
    bucket, endpoint = shapes
    kept = {i for i in range(N) if _score(i) >= 1}
    with FaultProxy(endpoint) as proxy:
        proxy.fail_next(2, path_contains="/a/metadata.jsonl")
        proxy.fail_next(3, path_contains="/a/00")  # the first reads of images 000-009
        proxy.fail_next(1, status=500, code="InternalError", path_contains="/a/01")
        with _loader(f"s3://{bucket}/a/", proxy.endpoint, cache_dir=str(tmp_path)) as loader:
            seen = {i for _, labels, _, _ in _batches(loader) for i in labels}
            stats = loader.stats()
        assert proxy.injected == 6
    assert seen <= kept and len(seen) >= len(kept) - 3 * 2  # leftovers: < a batch a bucket
    assert stats.retries == {"throttled": 5, "transient": 1} and not stats.skipped
    with FaultProxy(endpoint) as proxy:
        proxy.fail_next(2, path_contains="/a/metadata.jsonl")
        proxy.fail_next(1, path_contains="/a/metadata.jsonl", status=500, code="InternalError")

        async def manifest() -> bytes | bytearray:
            store = al.open_store(f"s3://{bucket}/", endpoint_url=proxy.endpoint)
            try:
                return await read_manifest_file(store, "a/metadata.jsonl")
            finally:
                await store.close()

        assert b'"file_name": "000.jpg"' in asyncio.run(manifest())
        assert proxy.injected == 3


def test_an_image_whose_header_cannot_be_read_stops_the_run_or_is_a_counted_skip(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A corrupt image and a name no object has, in a bucketed folder without sizes: under
    "raise" the run stops at its start, naming the image; under "skip" the rest of the
    folder streams, the two counted as skipped in each epoch (each in a full batch of the
    square bucket: 4 square photos and the two make 2 batches), and a second run on the
    node reads again only the corrupt one's header: the name no object has is missing by
    the listing, never asked for."""
    bucket = "shapes-bad"
    moto.create_bucket(bucket)
    rows = []
    for i in range(10):  # 4 square, 3 wide, 3 tall
        moto.put(bucket, f"s/{i}.jpg", _jpeg(i))
        rows.append({"file_name": f"{i}.jpg", "idx": i})
    moto.put(bucket, "s/bad.jpg", _jpeg(0)[:40] + bytes(300))  # its header cut short
    rows += [{"file_name": "bad.jpg", "idx": 10}, {"file_name": "gone.jpg", "idx": 11}]
    moto.put(bucket, "s/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())

    def loader(endpoint: str, **kw: Any) -> al.ImageLoader:
        return al.ImageLoader(
            f"s3://{bucket}/s/",
            batch_size=3,
            labels="idx",
            buckets=BUCKETS,
            cache_dir=str(tmp_path),
            engine=al.EngineConfig(mode="inline"),
            store=al.StoreConfig(options={"endpoint_url": endpoint}),
            **kw,
        )

    with pytest.raises(al.AsyncLoaderError, match=r"bad\.jpg: no image size"):
        loader(moto.endpoint)
    skip = al.ErrorConfig(on_error="skip", max_failures=2)
    with FaultProxy(moto.endpoint) as proxy:
        with loader(proxy.endpoint, errors=skip) as run:
            for epoch in range(2):
                run.set_epoch(epoch)
                seen = sorted(i for _, labels in run for i in labels.tolist())
                assert seen == list(range(10))
            stats = run.stats()
        assert stats.skipped == {"DecodeError": 2, "ObjectNotFound": 2}
        assert sorted(set(stats.skipped_keys)) == ["bad.jpg", "gone.jpg"]
        headers = Counter(proxy.ranges)
        with loader(proxy.endpoint, errors=skip) as again:
            assert sorted(i for _, labels in again for i in labels.tolist()) == list(range(10))
        second = Counter(proxy.ranges) - headers
    assert second == Counter({f"GET /{bucket}/s/bad.jpg": 1})
    # The name no object has is missing by the listing: never asked for, header or image.
    assert not [t for t in proxy.targets if t.endswith("/gone.jpg")]


@pytest.mark.parametrize("batch_size", [3, 2])
def test_images_of_unknown_size_are_read_and_counted_each_epoch_where_no_square_is(
    moto: MotoServer, tmp_path: Path, batch_size: int
) -> None:
    """Unreadable headers under "skip" in a folder of wide and tall photos only: the two
    images of unknown size join the fullest bucket (the wide one) first, spread over its
    batches, so each epoch reads them and counts them as skipped — none is left over for
    want of a square bucket's batch — and the photos stream as the buckets' rule says."""
    bucket = "shapes-unknown"
    moto.create_bucket(bucket)
    rows = []
    for i in (1, 2, 4, 5, 7, 8, 10):  # 4 wide, 3 tall
        moto.put(bucket, f"s/{i}.jpg", _jpeg(i))
        rows.append({"file_name": f"{i}.jpg", "idx": i})
    moto.put(bucket, "s/bad.jpg", _jpeg(0)[:40] + bytes(300))  # its header cut short
    rows += [{"file_name": "bad.jpg", "idx": 11}, {"file_name": "gone.jpg", "idx": 12}]
    moto.put(bucket, "s/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    skip = al.ErrorConfig(on_error="skip", max_failures=2)
    with al.ImageLoader(
        f"s3://{bucket}/s/",
        batch_size=batch_size,
        labels="idx",
        buckets=BUCKETS,
        cache_dir=str(tmp_path),
        errors=skip,
        engine=al.EngineConfig(mode="inline"),
        store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
    ) as run:
        wide, tall = [1, 4, 7, 10], [2, 5, 8]
        for epoch in range(3):
            run.set_epoch(epoch)
            batches = [(tuple(images.shape[2:]), labels.tolist()) for images, labels in run]
            seen = sorted(i for _, labels in batches for i in labels)
            assert all(shape == (24, 48) for shape, labels in batches if labels[0] in wide)
            if batch_size == 3:
                assert seen == sorted(wide + tall)
                assert sorted(len(labels) for _, labels in batches) == [2, 2, 3]
            else:  # the tall bucket leaves one over; a wide batch each the two join
                assert set(wide) <= set(seen) and len(set(seen) & set(tall)) == 2
                assert sorted(len(labels) for _, labels in batches) == [1, 1, 2, 2]
            assert run.stats().skipped == {"DecodeError": epoch + 1, "ObjectNotFound": epoch + 1}
        assert sorted(set(run.stats().skipped_keys)) == ["bad.jpg", "gone.jpg"]


def test_sizes_from_the_metadata_need_no_header_read(moto: MotoServer) -> None:
    bucket = "shapes-sized"
    moto.create_bucket(bucket)
    rows = []
    for i in range(9):
        moto.put(bucket, f"s/{i}.jpg", _jpeg(i))
        h, w = SHAPES[i % 3]
        rows.append({"file_name": f"{i}.jpg", "width": w, "height": h})
    moto.put(bucket, "s/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    with FaultProxy(moto.endpoint) as proxy:
        with al.ImageLoader(
            f"s3://{bucket}/s/",
            batch_size=3,
            labels=None,
            buckets=BUCKETS,
            engine=al.EngineConfig(mode="inline"),
            store=al.StoreConfig(options={"endpoint_url": proxy.endpoint}),
        ) as loader:
            shapes = sorted(tuple(x.shape[2:]) for x, _ in loader)
        assert shapes == sorted(BUCKETS.sizes)
        assert not proxy.ranges  # no header read
        assert all(proxy.targets[f"GET /{bucket}/s/{i}.jpg"] for i in range(9))
    # A size the metadata gets wrong is the sample's error, never wrong pixels.
    rows[4]["width"] = 200
    moto.put(bucket, "s/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    with (
        al.ImageLoader(
            f"s3://{bucket}/s/",
            batch_size=3,
            labels=None,
            buckets=BUCKETS,
            shuffle=False,
            engine=al.EngineConfig(mode="inline"),
            store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
        ) as loader,
        pytest.raises(
            al.DecodeError, match=r"4\.jpg is 90x40 pixels, but its size was recorded as 200x40"
        ),
    ):
        list(loader)


def test_resume_and_elastic_resume_of_a_bucketed_filtered_mix(shapes: tuple[str, str]) -> None:
    """Two sources by weight, bucketed and filtered: a state after 2 batches resumes the
    rest exactly; 2 ranks resumed on 3 and on 1 deliver the rest of the epoch once."""
    bucket, endpoint = shapes
    url = [al.Source(f"s3://{bucket}/a/", weight=2), al.Source(f"s3://{bucket}/b/", weight=1)]
    kw: dict[str, Any] = {"seed": 9, "samples_per_epoch": 36}  # 24 of a, 12 of b
    with _loader(url, endpoint, **kw) as loader:
        loader.set_epoch(1)
        whole = [b[1] for b in _batches(loader)]
    with _loader(url, endpoint, **kw) as loader:
        loader.set_epoch(1)
        it = iter(loader)
        head = [next(it)[1].tolist() for _ in range(2)]
        state = loader.state_dict()
    assert head == whole[:2] and state["buckets"] == BUCKETS.describe()
    with _loader(url, endpoint, **kw) as loader:
        loader.load_state_dict(state)
        assert [b[1] for b in _batches(loader)] == whole[2:]
    with _loader(url, endpoint, **kw, buckets=al.Buckets(((32, 32),))) as other:
        with pytest.raises(ValueError, match="buckets"):
            other.load_state_dict(state)

    # Elastic: 2 ranks take 1 batch each, then 3 ranks (and 1) deal the rest.
    consumed, saved = [], {}
    for rank in range(2):
        with _loader(url, endpoint, rank=rank, world_size=2, **kw) as loader:
            loader.set_epoch(1)
            consumed += next(iter(loader))[1].tolist()
            saved = loader.state_dict() if rank == 0 else saved
    flat = [i for b in whole for i in b]
    for new in (3, 1):
        rest: list[list[int]] = []
        for rank in range(new):
            with _loader(url, endpoint, rank=rank, world_size=new, **kw) as loader:
                loader.load_state_dict(saved)
                rest.append([i for b in _batches(loader) for i in b[1]])
        assert len({len(r) for r in rest}) == 1  # the same count on every rank
        delivered = [i for r in rest for i in r]
        assert set(delivered) | set(consumed) == set(flat) and not set(delivered) & set(consumed)
        extra = Counter(delivered) - Counter(flat)  # whole batches repeated to even the ranks
        assert sum(extra.values()) < new * 3

    # even="drop": 3 ranks leave out the batches past their last full round; after one
    # batch each, 2 ranks deal the rest of what the 3 would have dealt, and nothing else.
    drop = al.ShardConfig(even="drop")
    dealt = len(whole) - len(whole) % 3
    assert dealt < len(whole)  # (the data leaves a batch out: the case this is about)
    for rank in range(3):
        with _loader(url, endpoint, rank=rank, world_size=3, shard=drop, **kw) as loader:
            loader.set_epoch(1)
            assert next(iter(loader))[1].tolist() == whole[rank]
            saved = loader.state_dict() if rank == 0 else saved
    rest = []
    for rank in range(2):
        with _loader(url, endpoint, rank=rank, world_size=2, shard=drop, **kw) as loader:
            loader.load_state_dict(saved)
            rest += [b[1] for b in _batches(loader)]
    assert sorted(rest) == sorted(whole[3 : 3 + (dealt - 3) // 2 * 2])


def test_warm_keeps_the_sizes_so_a_bucketed_run_reads_no_header(
    shapes: tuple[str, str], tmp_path: Path
) -> None:
    """``warm`` notes each image's size from the bytes it fetched: the bucketed run after
    it sends no request at all, the store stopped."""
    bucket, endpoint = shapes
    with FaultProxy(endpoint) as proxy:
        report = al.warm(
            f"s3://{bucket}/a/", tmp_path, store_options={"endpoint_url": proxy.endpoint}
        )
        assert report.failed == [] and not proxy.ranges
        gone = proxy.endpoint
    with _loader(f"s3://{bucket}/a/", gone, cache_dir=str(tmp_path), seed=1) as loader:
        got = _batches(loader)
        assert loader.stats().requests == 0
    assert got and all(tuple(shape[2:]) in BUCKETS.sizes for shape, _, _, _ in got)


def test_a_cache_a_plain_run_filled_gives_the_header_pass_its_headers(
    shapes: tuple[str, str], tmp_path: Path
) -> None:
    """A cache filled by a run without buckets holds the images but no sizes: a bucketed
    run after it, and ``len()`` of a bucketed dataset, read each header from the node's
    disk — no request at all, the store stopped."""
    from asyncloader.torch import ImageDataset

    bucket, endpoint = shapes
    url, cache = f"s3://{bucket}/b/", str(tmp_path)
    kept = [i for i in range(N, 2 * N) if _score(i) >= 1]
    with FaultProxy(endpoint) as proxy:
        with _loader(url, proxy.endpoint, cache_dir=cache, buckets=None, extras=()) as plain:
            assert sorted(i for _, labels in plain for i in labels.tolist()) == kept  # type: ignore[misc]
        assert not proxy.ranges  # no header read: it has no buckets
        gone = proxy.endpoint
    ds = ImageDataset(
        url,
        batch_size=3,
        labels="idx",
        seed=2,
        buckets=BUCKETS,
        filters=[("score", ">=", 1)],
        cache_dir=cache,
        store=al.StoreConfig(options={"endpoint_url": gone}),
    )
    try:
        batches = len(ds)
    finally:
        ds.close()
    with _loader(url, gone, cache_dir=cache, seed=2) as loader:
        got = _batches(loader)
        stats = loader.stats()
    assert stats.requests == 0 and stats.bytes_from_cache > 0
    assert len(got) == batches
    seen = [i for _, labels, _, _ in got for i in labels]
    assert len(seen) == len(set(seen)) and set(seen) <= set(kept)
    for shape, labels, extras, _ in got:
        assert tuple(shape[2:]) in BUCKETS.sizes
        assert extras["original_size"] == [SHAPES[i % 3] for i in labels]


def test_formats_pillow_reads_only_whole_in_a_bucketed_upright_run_from_moto(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A lossless WebP over 1 MiB (its size from its first bytes), a WebP whose EXIF
    follows its pixels and a PNG whose eXIf chunk does (their orientation from their last
    64 KiB), an AVIF over 1 MiB turned by its ``irot`` (its size and orientation from its
    ``meta`` box, in its first read): each in the bucket of its upright shape, the
    reference's pixels; the next run with the store stopped."""
    rng = np.random.default_rng(7)

    def noise(w: int, h: int) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))

    def saved(img: Image.Image, fmt: str, o: int = 1, **kw: Any) -> bytes:
        if o != 1:
            exif = Image.Exif()
            exif[0x0112] = o
            kw["exif"] = exif
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    photos = {  # name → (bytes, orientation); every one stored landscape
        "a.webp": (saved(noise(700, 520), "WEBP", lossless=True), 1),
        "b.webp": (saved(noise(520, 340), "WEBP", 6, quality=95), 6),
        "c.avif": (saved(noise(1200, 640), "AVIF", 8, quality=100), 8),
        "d.png": (late_exif_png(noise(300, 200), 8), 8),
    }
    assert min(len(photos[k][0]) for k in ("a.webp", "c.avif")) > 1 << 20
    assert min(len(photos[k][0]) for k in ("b.webp", "d.png")) > 128 << 10
    moto.create_bucket("formats")
    for name, (data, _) in photos.items():
        moto.put("formats", f"p/{name}", data)
    rows = "".join(json.dumps({"file_name": n, "text": n}) + "\n" for n in photos)
    moto.put("formats", "p/metadata.jsonl", rows.encode())

    def run(endpoint: str) -> tuple[list[Any], al.Stats]:
        with al.ImageLoader(
            "s3://formats/p/",
            batch_size=1,
            labels=None,
            buckets=BUCKETS,
            extras=("text", "original_size", "crop_top_left"),
            cache_dir=str(tmp_path),
            decode=al.DecodeConfig(exif_orientation=True),
            engine=al.EngineConfig(mode="inline"),
            store=al.StoreConfig(
                extensions=(".webp", ".avif", ".png"), options={"endpoint_url": endpoint}
            ),
        ) as loader:
            got = [(x[0].numpy(), ex) for x, _, ex in loader]  # type: ignore[misc]
            return got, loader.stats()

    with FaultProxy(moto.endpoint) as proxy:
        got, stats = run(proxy.endpoint)
        gets = Counter(proxy.targets)
        gone = proxy.endpoint
    assert stats.skipped == {} and sorted(e["text"][0] for _, e in got) == sorted(photos)
    for pixels, extras in got:
        name = extras["text"][0]
        data, o = photos[name]
        shape = pixels.shape[1:]
        assert (shape[0] > shape[1]) == (o >= 5), name  # the upright shape's bucket
        ref, box, _ = bucket_reference(data, shape, tuple(extras["crop_top_left"][0]), True)
        want = np.asarray(ref.resize(shape[::-1], Image.Resampling.BILINEAR, box=box))
        assert np.array_equal(pixels, want.transpose(2, 0, 1)), name
    # The header pass: a.webp and c.avif one read, b.webp and d.png two (their ends
    # too); then each epoch's fetch.
    header_reads = {"a.webp": 1, "b.webp": 2, "c.avif": 1, "d.png": 2}
    epoch_reads = {"a.webp": 1, "b.webp": 1, "c.avif": 1, "d.png": 1}
    for name in photos:
        assert gets[f"GET /formats/p/{name}"] == header_reads[name] + epoch_reads[name], name
    again, stats = run(gone)
    assert stats.requests == 0
    assert sorted((e["text"][0], p.shape) for p, e in again) == sorted(
        (e["text"][0], p.shape) for p, e in got
    )
