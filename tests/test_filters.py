"""Filters before fetching (``filters=``): pyarrow's form over the metadata file's columns
and the listing's, applied at listing time — the same rows pyarrow keeps, an excluded image
never requested (counted at the server), the filter part of the resume state;
``metadata.parquet`` read beside ``.jsonl`` and ``.csv``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._base._filters import describe, keep_mask, normalize
from asyncloader._base._types import ObjectInfo
from asyncloader._cache import ObjectCache
from asyncloader._dataset._labels import build_dataset
from asyncloader._dataset._metadata import read_metadata
from asyncloader.testing import FaultProxy, MotoServer

N = 30

# --- the filter itself (pure), against pyarrow's own evaluation --------------------------

_OPS = ["=", "==", "!=", "<", "<=", ">", ">="]


def _term(column: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[str, str, Any]]:
    one = st.tuples(st.just(column), st.sampled_from(_OPS), values)
    many = st.tuples(
        st.just(column), st.sampled_from(["in", "not in"]), st.lists(values, min_size=1, max_size=3)
    )
    return one | many


_INTS = st.integers(-3, 3)
# -0.0 is left out: pyarrow's set lookup (hashing) tells it from 0.0, where its == and ours
# (and Python's) do not.
_FLOATS = st.floats(-3, 3, allow_nan=False).map(lambda f: round(f, 1) + 0.0)
_TEXTS = st.sampled_from(["", "a", "b", "ab", "B"])
_TERMS = _term("i", _INTS) | _term("f", _FLOATS) | _term("t", _TEXTS)


@st.composite
def _tables(draw: st.DrawFn) -> dict[str, list[Any]]:
    n = draw(st.integers(0, 12))
    return {
        "i": draw(st.lists(st.none() | _INTS, min_size=n, max_size=n)),
        "f": draw(st.lists(st.none() | _FLOATS, min_size=n, max_size=n)),
        "t": draw(st.lists(st.none() | _TEXTS, min_size=n, max_size=n)),
    }


@settings(max_examples=300, deadline=None)
@given(
    _tables(),
    st.lists(st.lists(_TERMS, min_size=1, max_size=3), min_size=1, max_size=3),
    st.booleans(),
)
def test_the_rows_kept_are_the_rows_pyarrow_keeps(
    columns: dict[str, list[Any]], groups: list[list[tuple[str, str, Any]]], flat: bool
) -> None:
    """Every op, AND and OR, nulls in the data: the same rows as pyarrow's
    ``filters_to_expression`` over the same table."""
    filters: Any = groups[0] if flat else groups
    n = len(columns["i"])
    table = pa.table(
        {
            "row": pa.array(range(n), pa.int64()),
            "i": pa.array(columns["i"], pa.int64()),
            "f": pa.array(columns["f"], pa.float64()),
            "t": pa.array(columns["t"], pa.string()),
        }
    )
    want = table.filter(pq.filters_to_expression(filters))["row"].to_pylist()
    mask = keep_mask(normalize(filters) or (), columns, n, [str(r) for r in range(n)], table="t")
    assert np.flatnonzero(mask).tolist() == want


@settings(max_examples=200, deadline=None)
@given(
    _tables(),
    st.lists(st.lists(_TERMS, min_size=1, max_size=3), min_size=1, max_size=3),
    st.sets(st.sampled_from(["i", "f", "t"]), min_size=1),
)
def test_a_filter_decided_before_a_column_is_known_keeps_every_row_that_may_pass(
    columns: dict[str, list[Any]], groups: list[list[tuple[str, str, Any]]], later: set[str]
) -> None:
    """Decided first without the columns ``later`` (the headers' width and height, read
    only for the rows kept then), a filter keeps every row the whole filter keeps; then
    applied again to those rows with them known, it keeps exactly those."""
    filters = normalize(groups) or ()
    n = len(columns["i"])
    names = [str(r) for r in range(n)]
    whole = keep_mask(filters, columns, n, names, table="t")
    first = {c: v for c, v in columns.items() if c not in later}
    before = keep_mask(filters, first, n, names, table="t", later=frozenset(later))
    assert not np.any(whole & ~before)
    rows = np.flatnonzero(before)
    again = keep_mask(
        filters, {c: [v[r] for r in rows] for c, v in columns.items()}, len(rows), names, table="t"
    )
    assert rows[again].tolist() == np.flatnonzero(whole).tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=12),
    st.lists(
        st.lists(
            _term("size", st.integers(-1, 6)) | _term("file_name", st.sampled_from(["k0", "k1"])),
            min_size=1,
            max_size=3,
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_sizes_asked_only_for_what_the_rest_of_the_filter_keeps_decide_the_same(
    rows: list[tuple[int, bool]], groups: list[list[tuple[str, str, Any]]]
) -> None:
    """A web server's listing leaves some sizes unasked (``UNSIZED``): decided with them
    unknown, a filter keeps every sample that the whole filter keeps; decided again with
    the sizes of those kept then asked (the others still unknown), it keeps exactly the
    samples it keeps with every size known."""
    from asyncloader._base._types import UNSIZED
    from asyncloader._dataset._filtering import passing
    from asyncloader._dataset._objects import ObjectList

    filters = normalize(groups) or ()
    keys = [f"k{i % 3}" for i in range(len(rows))]

    def objects(known: Any) -> ObjectList:
        return ObjectList.of(
            ObjectInfo(k, size if known(i, unasked) else UNSIZED)
            for i, (k, (size, unasked)) in enumerate(zip(keys, rows, strict=True))
        )

    whole = passing(objects(lambda i, unasked: True), keys, None, None, filters)
    before = passing(objects(lambda i, unasked: not unasked), keys, None, None, filters)
    assert not np.any(whole & ~before)
    again = passing(objects(lambda i, unasked: before[i] or not unasked), keys, None, None, filters)
    assert again.tolist() == whole.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(0, 9)), max_size=10),
    st.lists(
        st.lists(
            _term("width", st.integers(0, 7))
            | _term("height", st.integers(0, 7))
            | _term("size", st.integers(0, 10)),
            min_size=1,
            max_size=3,
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_each_image_read_whole_is_judged_as_the_whole_filter_judges_it(
    rows: list[tuple[int, int, int]], groups: list[list[tuple[str, str, Any]]]
) -> None:
    """The header pass asks of the images it read whole whether the filter keeps them once
    their headers' sizes are known (so that the cache keeps only samples): the same answer
    as the filter applied to every sample with every size known; a key not listed, none."""
    from asyncloader._dataset._filtering import passing, size_test
    from asyncloader._dataset._objects import ObjectList

    filters = normalize(groups) or ()
    keys = [f"{i}.jpg" for i in range(len(rows))]
    objects = ObjectList.of(ObjectInfo(k, n) for k, (_, _, n) in zip(keys, rows, strict=True))
    hw = np.array([(h, w) for h, w, _ in rows], dtype=np.int64).reshape(-1, 2)
    whole = passing(objects, keys, None, None, filters, hw)
    stays = size_test(objects, None, filters)
    assert list(stays(keys, [(h, w) for h, w, _ in rows])) == whole.tolist()
    assert list(stays(["gone.jpg"], [(1, 1)])) == [False]


def test_the_canonical_text_is_the_same_however_written() -> None:
    a = normalize([("score", "=", 5), ("tag", "in", {"b", "a"})])
    b = normalize([[("score", "==", 5), ("tag", "in", ["a", "b", "a"])]])
    assert a == b and describe(a) == describe(b)
    assert describe(normalize([])) is None and normalize(None) is None
    assert json.loads(describe(a) or "") == [[["score", "==", 5], ["tag", "in", ["a", "b"]]]]


@pytest.mark.parametrize(
    ("filters", "says"),
    [
        ([("a", "~", 1)], "the op must be one of"),
        ([("a", "in", "xy")], "takes a list of values"),
        ([("a", "=", object())], "is not text, a number"),
        ([("a", "=", float("nan"))], "is not text, a number"),
        ("a > 1", "must be a list of"),
        ([[("a", "=", 1)], []], "non-empty list"),
        ([("a", "=", 1), "b"], "is not a \\(column, op, value\\) tuple"),
    ],
)
def test_a_malformed_filter_is_a_clear_error(filters: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        normalize(filters)


def test_text_is_compared_as_a_number_and_nothing_else_silently() -> None:
    """CSV fields are text: ``>= 5`` reads them as numbers; text that is not a number, or
    order between a number and text, names the column and the sample."""
    columns: dict[str, list[Any]] = {"score": ["5.5", "4", None, "7"], "tag": ["x"] * 4}
    names = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    keep = keep_mask(normalize([("score", ">=", 5)]) or (), columns, 4, names, table="t")
    assert keep.tolist() == [True, False, False, True]
    columns["score"][3] = "high"
    with pytest.raises(ValueError, match=r"column 'score' of 'd.jpg': 'high' and 5"):
        keep_mask(normalize([("score", ">=", 5)]) or (), columns, 4, names, table="t")
    with pytest.raises(ValueError, match=r"no column 'scor' in t \(there: score, tag\)"):
        keep_mask(normalize([("scor", ">=", 5)]) or (), columns, 4, names, table="t")


def test_labels_are_given_before_the_filter_and_the_listing_columns_filter() -> None:
    """A class every sample of which is filtered away keeps its index; ``size`` and
    ``file_name`` are the listing's; the filtered samples are counted."""
    objects = [ObjectInfo(f"{c}/{i}.jpg", 100 * i, f"e{i}") for c in "abc" for i in range(1, 4)]
    ds = build_dataset(
        objects,
        "folder",
        filters=normalize([[("size", ">=", 200), ("file_name", "!=", "c/3.jpg")]]),
    )
    assert ds.classes == ("a", "b", "c")
    assert [s.obj.key for s in ds.samples] == [
        "a/2.jpg",
        "a/3.jpg",
        "b/2.jpg",
        "b/3.jpg",
        "c/2.jpg",
    ]
    assert ds.samples.labels.tolist() == [0, 0, 1, 1, 2] and ds.filtered == 4


def test_metadata_parquet_is_read_as_jsonl_is() -> None:
    buf = io.BytesIO()
    pq.write_table(
        pa.table({"file_name": ["/a/1.jpg", "b/2.jpg"], "score": [4.5, None], "n": [1, 2]}), buf
    )
    meta = read_metadata(buf.getvalue(), "metadata.parquet")
    assert meta.file_names == ["a/1.jpg", "b/2.jpg"]
    assert meta.columns == {"score": [4.5, None], "n": [1, 2]}
    with pytest.raises(ValueError, match=r"metadata\.parquet: not a Parquet file"):
        read_metadata(b"not parquet", "metadata.parquet")
    buf = io.BytesIO()
    pq.write_table(pa.table({"name": ["a.jpg"]}), buf)
    with pytest.raises(ValueError, match="needs a 'file_name' column"):
        read_metadata(buf.getvalue(), "metadata.parquet")


# --- through the loader, from moto, counted at the server ---------------------------------


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32 + 8 * (i % 3), 24), (i * 8, 90, 200 - i * 5)).save(buf, "JPEG")
    return buf.getvalue()


def _score(i: int) -> float:
    return (i * 7) % 10 + 0.5


@pytest.fixture(scope="module")
def scored(moto: MotoServer) -> tuple[str, str]:
    """Two folders on moto of ``N`` JPEGs each with scores and captions: one with
    ``metadata.jsonl``, one with ``metadata.parquet``; the bucket name and moto's
    endpoint."""
    bucket = "scored"
    moto.create_bucket(bucket)
    rows = [
        {"file_name": f"{i:03d}.jpg", "idx": i, "score": _score(i), "caption": f"c{i}"}
        for i in range(N)
    ]
    for i in range(N):
        moto.put(bucket, f"jsonl/{i:03d}.jpg", _jpeg(i))
        moto.put(bucket, f"parquet/{i:03d}.jpg", _jpeg(i))
    moto.put(bucket, "jsonl/metadata.jsonl", "\n".join(json.dumps(r) for r in rows).encode())
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    moto.put(bucket, "parquet/metadata.parquet", buf.getvalue())
    return bucket, moto.endpoint


def _loader(url: str, endpoint: str, filters: Any, **kw: Any) -> al.ImageLoader:
    return al.ImageLoader(
        url,
        batch_size=4,
        labels="idx",
        filters=filters,
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
        **kw,
    )


@pytest.mark.parametrize("folder", ["jsonl", "parquet"])
def test_a_filtered_out_image_is_never_requested(scored: tuple[str, str], folder: str) -> None:
    bucket, endpoint = scored
    filters = [[("score", ">=", 5), ("caption", "!=", "c3")], [("idx", "in", [0, 1])]]
    kept = sorted(i for i in range(N) if (_score(i) >= 5 and i != 3) or i < 2)
    assert 0 < len(kept) < N - 5
    with FaultProxy(endpoint) as proxy:
        with _loader(
            f"s3://{bucket}/{folder}/", proxy.endpoint, filters, extras=("caption",)
        ) as loader:
            got = [
                (i, c)
                for _, labels, ex in loader
                for i, c in zip(labels.tolist(), ex["caption"], strict=True)
            ]  # type: ignore[misc]
            stats = loader.stats()
        targets = dict(proxy.targets)
    assert sorted(got) == [(i, f"c{i}") for i in kept]
    assert stats.filtered_out == N - len(kept)
    assert f"samples left out by filters=: {N - len(kept)}" in stats.summary()
    gets = {t.split("?")[0] for t in targets if t.startswith("GET ")}
    for i in range(N):
        key = f"GET /{bucket}/{folder}/{i:03d}.jpg"
        assert (key in gets) == (i in kept), key


def test_a_filter_over_the_width_reads_the_headers_of_what_the_rest_keeps_once(
    scored: tuple[str, str], tmp_path: Path
) -> None:
    """``width`` is no column of the metadata file: it comes from each image's header.  The
    images the rest of the filter leaves out are never requested; those left out by their
    width only for their header (a range request); those it keeps once, by the same read
    (they are small: it fetched them whole, and the cache kept them for the epoch); a
    second run on the same node requests none of them, its sizes kept beside the listing
    and the images in the cache."""
    bucket, endpoint = scored
    filters = [("score", ">=", 5), ("width", ">=", 40)]  # widths 32, 40, 48 (i % 3)
    maybe = [i for i in range(N) if _score(i) >= 5]
    kept = [i for i in maybe if 32 + 8 * (i % 3) >= 40]
    assert 0 < len(kept) < len(maybe) < N
    for run in range(2):
        with FaultProxy(endpoint) as proxy:
            with _loader(
                f"s3://{bucket}/jsonl/", proxy.endpoint, filters, cache_dir=str(tmp_path)
            ) as loader:
                got = sorted(i for _, labels in loader for i in labels.tolist())
                stats = loader.stats()
            targets, ranges = dict(proxy.targets), dict(proxy.ranges)
        assert got == kept
        assert stats.filtered_out == N - len(kept)
        for i in range(N):
            key = f"GET /{bucket}/jsonl/{i:03d}.jpg"
            asked = sum(n for t, n in targets.items() if t.split("?")[0] == key)
            ranged = sum(n for t, n in ranges.items() if t.split("?")[0] == key)
            if i not in maybe or run == 1:
                assert asked == 0, (run, key)
            else:  # its header, and nothing else: kept or not, it came whole with it
                assert asked == ranged == 1, (run, key, asked, ranged)
        # Its header's read fetched each image whole (they are small), but the cache keeps
        # only the ones the filter kept: those its width left out are no samples.
        with ObjectCache(tmp_path) as cache:
            cached = {k.split("\x00")[1] for k in cache.entry_keys()}
        assert cached == {f"{i:03d}.jpg" for i in kept}, run
    with pytest.raises(al.AsyncLoaderError, match="filters= left out every one of its"):
        with _loader(f"s3://{bucket}/jsonl/", endpoint, [("width", ">", 48)]) as loader:
            next(iter(loader))


def test_an_image_whose_header_cannot_be_read_under_a_width_filter(moto: MotoServer) -> None:
    """Under a filter over the width, a corrupt image and a name no object has stop the run
    at its start, naming the first; under "skip" both are kept, fail when read, and are
    counted as skipped; the filter holds for the rest."""
    bucket = "scored-bad"
    moto.create_bucket(bucket)
    rows = [{"file_name": f"{i}.jpg", "idx": i} for i in range(6)]
    for i in range(6):
        moto.put(bucket, f"f/{i}.jpg", _jpeg(i))
    moto.put(bucket, "f/bad.jpg", b"\xff\xd8\xff" + bytes(200))  # no frame header
    rows += [{"file_name": "bad.jpg", "idx": 6}, {"file_name": "gone.jpg", "idx": 7}]
    moto.put(bucket, "f/metadata.jsonl", "\n".join(json.dumps(r) for r in rows).encode())
    url, filters = f"s3://{bucket}/f/", [("width", ">=", 40)]
    with pytest.raises(al.AsyncLoaderError, match=r"bad\.jpg: no image size"):
        _loader(url, moto.endpoint, filters)
    skip = al.ErrorConfig(on_error="skip", max_failures=2)
    with _loader(url, moto.endpoint, filters, errors=skip) as loader:
        got = sorted(i for _, labels in loader for i in labels.tolist())
        stats = loader.stats()
    assert got == [i for i in range(6) if 32 + 8 * (i % 3) >= 40]
    assert stats.filtered_out == 2 and sum(stats.skipped.values()) == 2
    assert sorted(stats.skipped_keys) == ["bad.jpg", "gone.jpg"]


def test_the_filter_is_part_of_the_resume_state_and_of_len(scored: tuple[str, str]) -> None:
    bucket, endpoint = scored
    url = f"s3://{bucket}/jsonl/"
    filters = [("score", ">", 4)]
    with _loader(url, endpoint, filters, seed=3) as loader:
        batches = iter(loader)
        first = [next(batches)[1].tolist() for _ in range(2)]
        state = loader.state_dict()
        rest = [labels.tolist() for _, labels in batches]
    assert state["filters"] == describe(normalize(filters))
    with _loader(
        url, endpoint, [[("score", ">", 4)]], seed=3
    ) as again:  # the same, written otherwise
        again.load_state_dict(state)
        assert [labels.tolist() for _, labels in again] == rest
    with _loader(url, endpoint, [("score", ">", 5)], seed=3) as other:
        with pytest.raises(ValueError, match="filters"):
            other.load_state_dict(state)
    from asyncloader.torch import ImageDataset

    ds = ImageDataset(
        url,
        batch_size=4,
        labels="idx",
        filters=filters,
        store=al.StoreConfig(options={"endpoint_url": endpoint}),
    )
    delivered = sum(1 for _ in ds)
    assert len(ds) == delivered == len(first) + len(rest)
    assert sorted(i for b in first + rest for i in b) == [i for i in range(N) if _score(i) > 4]


def test_a_filter_over_a_column_no_file_has_names_the_columns(
    scored: tuple[str, str], tmp_path: Path
) -> None:
    bucket, endpoint = scored
    with pytest.raises(
        ValueError, match=r"no column 'aesthetic' in metadata.jsonl and the listing"
    ):
        with _loader(f"s3://{bucket}/jsonl/", endpoint, [("aesthetic", ">=", 5)]) as loader:
            next(iter(loader))
