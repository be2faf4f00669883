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

from asyncloader._base._errors import StoreError
from asyncloader._base._types import ObjectInfo
from asyncloader._dataset._labels import IMAGE_EXTENSIONS, DatasetBuilder, build_dataset
from asyncloader._stores._listing import Chunk, Page, list_chunks

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


# --- S3 listing pages: the scan against the XML parser ------------------------------------

page_keys = st.lists(
    st.text(alphabet="ab/é &<>'\"._-0", min_size=1, max_size=8), unique=True, max_size=12
)
etags = st.sampled_from(
    ['"0123456789abcdef0123456789abcdef"', '"abc-3"', 'W/"weak"', "plain", '"a&amp;b"']
)


def _page_xml(
    objects: list[tuple[str, int, str]], folders: list[str], token: str | None, *, ns: bool
) -> bytes:
    from xml.sax.saxutils import escape

    root = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"' if ns else ""
    parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult{root}>']
    parts.append(f"<Name>b</Name><Prefix>r/</Prefix><KeyCount>{len(objects)}</KeyCount>")
    parts.append(f"<IsTruncated>{'true' if token is not None else 'false'}</IsTruncated>")
    if token is not None:
        parts.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
    quote = {'"': "&quot;"}
    for key, size, etag in objects:
        parts.append(
            f"<Contents><Key>{escape(key)}</Key><LastModified>2026-01-01T00:00:00.000Z"
            f"</LastModified><ETag>{escape(etag, quote)}</ETag><Size>{size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    parts += [f"<CommonPrefixes><Prefix>{escape(f)}</Prefix></CommonPrefixes>" for f in folders]
    parts.append("</ListBucketResult>\n")
    return "".join(parts).encode()


@settings(max_examples=300)
@given(
    keys=page_keys,
    sizes=st.lists(st.integers(0, 10**12), min_size=12, max_size=12),
    tags=st.lists(etags, min_size=12, max_size=12),
    folders=st.lists(st.text(alphabet="ab&é ", min_size=1, max_size=4), max_size=3),
    token=st.none() | st.text(alphabet="ab+/=&", max_size=6),
    ns=st.booleans(),
    cut_at=st.none() | st.integers(1, 400),
)
def test_an_s3_page_scanned_reads_as_the_xml_parser_reads_it(
    keys: list[str],
    sizes: list[int],
    tags: list[str],
    folders: list[str],
    token: str | None,
    ns: bool,
    cut_at: int | None,
) -> None:
    """The scan gives exactly what ElementTree gives, or declines (None) and leaves the
    page to it: escaped characters, a page cut short."""
    from asyncloader._base._errors import TransientStoreError
    from asyncloader._stores._s3_pages import parsed_page, plain_page

    objects = [("r/" + k, s, t) for k, s, t in zip(keys, sizes, tags, strict=False)]
    body = _page_xml(objects, ["r/" + f + "/" for f in folders], token, ns=ns)
    if cut_at is not None:
        body = body[: max(0, len(body) - cut_at)]
    scanned = plain_page(body, 2)
    try:
        parsed = parsed_page(body, 2, what="s3://b/r/", key="r/")
    except TransientStoreError:
        assert scanned is None
        return
    if scanned is not None:
        assert scanned == parsed
    elif cut_at is None and not any("&" in k or "<" in k or ">" in k for k in keys):
        # Only escapes (or a cut page) may send a page to the parser.
        escaped_tag = any("&" in t for t in tags[: len(keys)])
        escaped = escaped_tag or any(set("&<>") & set(f) for f in folders)
        assert escaped or (token is not None and "&" in token)


# --- a flat prefix listed by key ranges side by side ---------------------------------------


def _fake_s3(keys: list[str], page_size: int) -> tuple[object, list[int]]:
    """A ListObjectsV2 over sorted ``keys`` (full names): ``start-after``, continuation
    tokens, the ``/`` delimiter and pages of ``page_size``; and its request counter."""
    import bisect

    ordered = sorted(set(keys))
    calls = [0]

    async def fetch(
        full: str, delimited: bool, start_after: str, token: str | None
    ) -> tuple[Page, list[str], str | None]:
        calls[0] += 1
        await asyncio.sleep(0)
        after = token if token is not None else start_after
        i = max(bisect.bisect_left(ordered, full), bisect.bisect_right(ordered, after))
        objects: Page = []
        prefixes: list[str] = []
        last = ""
        while i < len(ordered) and ordered[i].startswith(full):
            k = ordered[i]
            cut = k.find("/", len(full)) if delimited else -1
            if len(objects) + len(prefixes) >= page_size:
                return objects, prefixes, last
            if cut >= 0:
                prefixes.append(k[: cut + 1])
                last = k[: cut + 1] + "\U0010ffff"
                i = bisect.bisect_left(ordered, last, i)
                continue
            objects.append(ObjectInfo(k[len(ROOT) :], 1, ""))
            last = k
            i += 1
        return objects, prefixes, None

    return fetch, calls


flat_names = st.lists(
    st.text(alphabet="0123456789ab/._", min_size=1, max_size=7), min_size=0, max_size=120
)


@settings(max_examples=200)
@given(names=flat_names, page_size=st.integers(1, 9), delimited=st.booleans())
def test_ranges_list_every_key_once_in_order(
    names: list[str], page_size: int, delimited: bool
) -> None:
    from asyncloader._stores._listing import ranged_pages

    full = ROOT + "p/"
    keys = [full + n for n in names] + [ROOT + "q/outside"]
    fetch, _ = _fake_s3(keys, page_size)

    async def run() -> tuple[list[str], list[str]]:
        got: list[str] = []
        folders: list[str] = []
        async for objects, prefixes in ranged_pages(
            fetch,  # type: ignore[arg-type]
            full,
            root=ROOT,
            delimited=delimited,
            concurrency=4,
        ):
            got += [ROOT + o.key for o in objects]
            folders += prefixes
        return got, folders

    got, folders = asyncio.run(run())
    inside = sorted({full + n for n in names})
    if delimited:
        expected = [k for k in inside if "/" not in k[len(full) :]]
        nested = [k for k in inside if "/" in k[len(full) :]]
        assert folders == sorted({k[: k.index("/", len(full)) + 1] for k in nested})
    else:
        expected, folders = inside, []
    assert got == expected


def test_a_long_flat_run_is_listed_by_ranges_side_by_side() -> None:
    """10 000 numbered keys, 100 a page: the pages come out in order, every key once, and
    the requests run side by side, a few more than a page after another would need."""
    from asyncloader._stores._listing import ranged_pages, split_points

    full = ROOT + "flat/"
    keys = [f"{full}img_{i:06d}.jpg" for i in range(10_000)]
    fetch, calls = _fake_s3(keys, 100)
    at_once = [0, 0]

    async def counted(*args: object) -> tuple[Page, list[str], str | None]:
        at_once[0] += 1
        at_once[1] = max(at_once)
        try:
            return await fetch(*args)  # type: ignore[operator, no-any-return]
        finally:
            at_once[0] -= 1

    async def run() -> list[str]:
        return [
            ROOT + o.key
            async for objects, _ in ranged_pages(
                counted, full, root=ROOT, delimited=True, concurrency=8
            )
            for o in objects
        ]

    assert asyncio.run(run()) == keys
    assert at_once[1] > 1
    assert 100 <= calls[0] <= 100 + 45
    lo = keys[99][len(ROOT) :]
    points = split_points(lo, None, "0123456789", floor=len("flat/"), dense=len("flat/") + 7)
    assert points == sorted(points) and all(lo < p for p in points)
    assert all(p.startswith("flat/") for p in points)


def test_a_flat_million_style_bucket_on_the_light_server() -> None:
    """The light server's synthetic bucket (names, sizes and ETags, no bodies): a flat run
    of 5000 numbered keys lists exactly, through the range listing, in a handful more
    requests than its pages; a foldered one too.  The list is compact."""
    import asyncloader as al
    from asyncloader._dataset._objects import ObjectList
    from asyncloader.testing import S3TestServer

    for folders in (0, 7):
        with S3TestServer(bucket="b", prefix="t/", synthetic=5000, synthetic_folders=folders) as s:
            objects = al.listing("s3://b/t/", store_options={"endpoint_url": s.endpoint})
            lists = s.stats()["counters"]["list"]
        if folders:
            names = sorted(f"class_{i % folders:04d}/img_{i:07d}.jpg" for i in range(5000))
        else:
            names = [f"img_{i:07d}.jpg" for i in range(5000)]
            assert 5 <= lists <= 5 + 45  # 5 pages of 1000, and the ranges' overlaps
        assert isinstance(objects, ObjectList)
        assert [o.key for o in objects] == names
        assert {o.size for o in objects} == {objects[0].size} and objects[0].size > 100
        assert objects.nbytes() < 5000 * 64
