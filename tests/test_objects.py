"""Compact object and sample lists: every way in and out gives back the same objects."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncloader._base._types import ObjectInfo, Sample
from asyncloader._dataset._objects import ObjectList, ObjectListBuilder, SampleList

etag = st.one_of(
    st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),  # MD5: packed to 16 bytes
    st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32),  # upper case: kept as is
    st.text(alphabet="0123456789abcdef-", max_size=36),  # multipart, empty, ...
)
objects = st.lists(
    st.builds(ObjectInfo, st.text(min_size=1, max_size=12), st.integers(-1, 2**40), etag),
    max_size=40,
)


@settings(max_examples=200)
@given(items=objects, cut=st.integers(0, 40), order=st.lists(st.integers(0, 39), max_size=20))
def test_an_object_list_holds_exactly_its_objects(
    items: list[ObjectInfo], cut: int, order: list[int]
) -> None:
    ol = ObjectList.of(items)
    assert len(ol) == len(items)
    assert list(ol) == items == ol
    assert [ol[i] for i in range(-len(items), len(items))] == items + items
    assert list(ol[cut:]) == items[cut:]
    idx = [i for i in order if i < len(items)]
    assert list(ol.take(idx)) == [items[i] for i in idx]
    assert list(pickle.loads(pickle.dumps(ol))) == items
    buf = io.BytesIO()
    np.savez(buf, **ol.arrays())
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as saved:
        assert list(ObjectList.from_arrays(saved)) == items
    halves = ObjectList.concat([ObjectList.of(items[:cut]), ObjectList.of(items[cut:])])
    assert list(halves) == items
    builder = ObjectListBuilder(chunk=3)
    for o in items:
        builder.add(o)
    assert list(builder.build()) == items
    with pytest.raises(IndexError):
        ol[len(items)]


def test_md5_etags_take_16_bytes() -> None:
    items = [ObjectInfo(f"k{i}", i, f"{i:032x}") for i in range(1000)]
    ol = ObjectList.of(items)
    assert ol.nbytes() < 1000 * (2 + 8 + 8 + 8 + 16 + 1)
    assert list(ol) == items


def test_damaged_arrays_are_refused() -> None:
    arrays = ObjectList.of([ObjectInfo("a", 1, "x"), ObjectInfo("b", 2, "y")]).arrays()
    with pytest.raises(ValueError, match="damaged"):
        ObjectList.from_arrays({**arrays, "sizes": np.zeros(3, np.int64)})
    with pytest.raises(ValueError, match="damaged"):
        ObjectList.from_arrays({**arrays, "keys_offsets": np.array([0, 1, 5])})


def test_a_sample_list_pairs_objects_and_labels() -> None:
    items = [ObjectInfo(f"c{i % 3}/{i}.jpg", i, "") for i in range(10)]
    samples = SampleList(ObjectList.of(items), [i % 3 for i in range(10)])
    assert list(samples) == [Sample(o, i % 3) for i, o in enumerate(items)]
    assert samples[4] == Sample(items[4], 1)
    assert list(samples[2:5]) == [Sample(items[i], i % 3) for i in range(2, 5)]
    assert list(pickle.loads(pickle.dumps(samples))) == list(samples)
    with pytest.raises(ValueError, match="differ"):
        SampleList(ObjectList.of(items), [0])


@pytest.mark.parametrize("labels", [["3", "1", "3"], ["cat", "ant", "cat"]])
def test_a_columnar_manifest_makes_the_dataset_its_rows_make(labels: list[str]) -> None:
    from asyncloader._dataset._labels import (
        build_dataset,
        columnar_manifest,
        read_columnar_manifest,
    )

    items = [ObjectInfo(f"k{i}.jpg", 10 + i, f"{i:032x}") for i in range(3)]
    buf = io.BytesIO()
    np.savez(buf, **columnar_manifest(ObjectList.of(items), labels))
    arrays = read_columnar_manifest(buf.getvalue(), "m.npz")
    rows = build_dataset(
        items, "m.jsonl", manifest=[(o.key, lab) for o, lab in zip(items, labels, strict=True)]
    )
    assert list(arrays.samples) == list(rows.samples)
    assert arrays.classes == rows.classes
    with pytest.raises(ValueError, match="not a columnar manifest"):
        read_columnar_manifest(b"not a zip", "m.npz")
