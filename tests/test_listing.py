"""Property tests of the ordered, streaming listing and the dataset built from it.

A fake S3-style paginated listing (delimited pages of objects and common prefixes in key
order) feeds ``list_chunks``; the chunks must come out in sorted key order, and the dataset
``DatasetBuilder`` makes of them chunk by chunk must be exactly what ``build_dataset`` makes
of the whole listing — the same samples, order, labels and classes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, MutableSequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._errors import StoreError
from asyncloader._labels import IMAGE_EXTENSIONS, DatasetBuilder, build_dataset
from asyncloader._stores._listing import Chunk, Page, list_chunks
from asyncloader._types import ObjectInfo

ROOT = "data/"  # the store's root prefix; keys are relative to it

# Names with characters that sort before "/" (" ", "-", ".") are where key order and
# folder order part ways ("cat-black/x" < "cat/x" but "cat" < "cat-black").
names = st.text(alphabet="ab-. ", min_size=1, max_size=3).filter(lambda s: s.strip(". ") != "")
keys = st.lists(
    st.tuples(
        st.lists(names, min_size=0, max_size=2), names, st.sampled_from([".jpg", ".png", ".txt"])
    ).map(lambda t: "/".join([*t[0], t[1] + t[2]])),
    max_size=60,
    unique=True,
)


class FakeBucket:
    """S3 ListObjectsV2 semantics over a set of keys: pages of ``page_size`` entries in key
    order; with a delimiter, keys below a sub-folder roll up into its common prefix."""

    def __init__(self, rel_keys: list[str], page_size: int, seed: int) -> None:
        self.keys = sorted(ROOT + k for k in rel_keys)
        self.page_size = page_size
        self.rng = random.Random(seed)

    async def pages(self, full: str, folders: MutableSequence[str] | None) -> AsyncIterator[Page]:
        entries: list[tuple[str, bool]] = []  # (key or common prefix, is_prefix)
        for key in self.keys:
            if not key.startswith(full):
                continue
            rest = key[len(full) :]
            if folders is not None and "/" in rest:
                prefix = full + rest.split("/", 1)[0] + "/"
                if not entries or entries[-1][0] != prefix:
                    entries.append((prefix, True))
            else:
                entries.append((key, False))
        for i in range(0, len(entries), self.page_size):
            for _ in range(self.rng.randrange(3)):  # folders finish in any order
                await asyncio.sleep(0)
            page = entries[i : i + self.page_size]
            if folders is not None:
                folders.extend(e for e, is_prefix in page if is_prefix)
            yield [ObjectInfo(e[len(ROOT) :], 1, "e") for e, is_prefix in page if not is_prefix]


async def _chunks(bucket: FakeBucket, concurrency: int) -> list[Chunk]:
    return [
        c async for c in list_chunks(bucket.pages, ROOT, cut=len(ROOT), concurrency=concurrency)
    ]


@settings(max_examples=150, deadline=None)
@given(
    rel=keys,
    page_size=st.integers(1, 7),
    concurrency=st.integers(1, 4),
    seed=st.integers(0, 1000),
    labels=st.sampled_from(["folder", None, "callable"]),
)
def test_streamed_dataset_equals_the_whole_listing(
    rel: list[str], page_size: int, concurrency: int, seed: int, labels: str | None
) -> None:
    chunks = asyncio.run(_chunks(FakeBucket(rel, page_size, seed), concurrency))
    streamed = [o.key for objects, _ in chunks for o in objects]
    assert streamed == sorted(rel)
    spec = len if labels == "callable" else labels
    builder = DatasetBuilder(spec, IMAGE_EXTENSIONS)  # type: ignore[arg-type]
    for objects, ahead in chunks:
        before = list(builder.samples)
        builder.add(objects, ahead)
        assert builder.samples[: len(before)] == before  # samples are only appended
    whole = build_dataset(
        [ObjectInfo(k, 1, "e") for k in rel],
        spec,  # type: ignore[arg-type]
        extensions=IMAGE_EXTENSIONS,
    )
    assert builder.finish() == whole


def test_a_flat_folder_streams_page_by_page() -> None:
    rel = [f"{i:04d}.jpg" for i in range(50)]
    chunks = asyncio.run(_chunks(FakeBucket(rel, 10, 0), 4))
    assert [len(objects) for objects, _ in chunks] == [10] * 5


def test_top_level_images_after_a_folder_count_as_a_class_before_it() -> None:
    # "" (images at the top) is class 0 even though "zebra.jpg" comes after "cat/" in order.
    chunks = asyncio.run(_chunks(FakeBucket(["cat/1.jpg", "zebra.jpg"], 1, 0), 2))
    builder = DatasetBuilder("folder", IMAGE_EXTENSIONS)
    builder.add(*chunks[0])
    assert [(s.obj.key, s.label) for s in builder.samples] == [("cat/1.jpg", 1)]


def test_an_out_of_order_listing_is_an_error() -> None:
    async def pages(full: str, folders: MutableSequence[str] | None) -> AsyncIterator[Page]:
        yield [ObjectInfo("b.jpg", 1, "e"), ObjectInfo("a.jpg", 1, "e")]

    async def run() -> None:
        async for _ in list_chunks(pages, ROOT, cut=len(ROOT), concurrency=1):
            pass

    with pytest.raises(StoreError, match="not in key order"):
        asyncio.run(run())


def test_a_failing_folder_listing_cancels_the_others() -> None:
    started: list[str] = []

    async def pages(full: str, folders: MutableSequence[str] | None) -> AsyncIterator[Page]:
        if folders is not None:
            folders.extend(f"{ROOT}{c}/" for c in "abc")
            yield []
            return
        started.append(full)
        if full.endswith("b/"):
            raise StoreError("listing b failed")
        await asyncio.sleep(30)  # would hang the test if not cancelled
        yield []

    async def run() -> None:
        async for _ in list_chunks(pages, ROOT, cut=len(ROOT), concurrency=3):
            pass

    with pytest.raises(StoreError, match="listing b failed"):
        asyncio.run(asyncio.wait_for(run(), 10))
