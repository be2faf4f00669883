"""Metadata and captions beside the images (``extras=``): the root's ``metadata.jsonl`` /
``metadata.csv`` (Hugging Face's imagefolder convention), and those of its folders (each
naming images relative to its own folder), name the samples and give them columns and
labels; same-stem sidecar files (``x.txt``, ``x.json`` beside ``x.jpg``) are
fetched by the engine with their image, cached with it, and delivered in batch order; a
missing sidecar is None, a malformed one follows ``on_error``.  Against moto, Azurite and
the GCS emulator."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import asyncloader as al
from asyncloader._base._types import ObjectInfo
from asyncloader._dataset._labels import build_dataset
from asyncloader._dataset._metadata import (
    merge_metadata,
    metadata_objects,
    named_not_there,
    read_metadata,
    resolve_extras,
)
from asyncloader._dataset._objects import ObjectList

from .conftest import Backend

N = 24


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40 + i, 30), ((i * 37) % 256, (i * 91) % 256, 128)).save(buf, "JPEG")
    return buf.getvalue()


def _names() -> list[str]:
    return [f"{'cat' if i % 3 else 'dog'}/{i:03d}.jpg" for i in range(N)]


def _caption(i: int) -> str:
    return f"a picture, number {i}, «ünïcode»"


# --- the metadata file, and what names what (pure) ---------------------------------------


def test_metadata_jsonl_keeps_json_types_and_csv_gives_text() -> None:
    jsonl = b'{"file_name": "a/1.jpg", "caption": "x", "n": 3, "tags": ["p", "q"]}\n\n'
    jsonl += b'{"file_name": "/b/2.jpg", "caption": null}\n'
    meta = read_metadata(jsonl, "metadata.jsonl")
    assert meta.file_names == ["a/1.jpg", "b/2.jpg"]
    assert meta.columns == {"caption": ["x", None], "n": [3, None], "tags": [["p", "q"], None]}
    csv = b'file_name,caption,label\r\na/1.jpg,"one, two",7\r\nb/2.jpg,,8\r\n'
    meta = read_metadata(b"\xef\xbb\xbf" + csv, "metadata.csv")  # a BOM, as Excel writes
    assert meta.columns == {"caption": ["one, two", None], "label": ["7", "8"]}


@pytest.mark.parametrize(
    ("data", "name", "says"),
    [
        (b'{"file_name": "a.jpg"}\n{"caption": "x"}\n', "metadata.jsonl", ":2: a row without"),
        (b'{"file_name": "a.jpg"}\n{"file_name": "a.jpg"}\n', "metadata.jsonl", "twice"),
        (b'{"file_name": "a.jpg"}\n{oops\n', "metadata.jsonl", ":2: not JSON"),
        (b'["a.jpg"]\n', "metadata.jsonl", ":1: expected a JSON object"),
        (b"caption\nx\n", "metadata.csv", "'file_name' column"),
        (b"file_name\n\xff\n", "metadata.csv", "not UTF-8"),
    ],
)
def test_a_malformed_metadata_file_is_named_with_its_line(
    data: bytes, name: str, says: str
) -> None:
    with pytest.raises(ValueError, match=rf"{name}.*{says}|{says}"):
        read_metadata(data, name)


def _objects(keys: list[str]) -> list[ObjectInfo]:
    return [ObjectInfo(k, 10, f"e{i}") for i, k in enumerate(keys)]


def test_the_metadata_file_names_the_samples_and_gives_labels() -> None:
    keys = ["b/2.jpg", "a/1.jpg", "a/3.jpg", "a/1.txt", "metadata.jsonl"]
    meta = read_metadata(
        b'{"file_name": "b/2.jpg", "label": "dog"}\n'
        b'{"file_name": "a/1.jpg", "label": "cat"}\n'
        b'{"file_name": "a/9.jpg", "label": "cat"}\n',
        "metadata.jsonl",
    )
    ds = build_dataset(_objects(keys), "label", metadata=meta, extras=("label", "txt"))
    # Key order; a.3 is not named (left out, counted); a/9.jpg is named and not listed
    # (kept with an unknown size: reported missing when read).
    assert [s.obj.key for s in ds.samples] == ["a/1.jpg", "a/9.jpg", "b/2.jpg"]
    assert ds.samples[1].obj.size == -1
    assert ds.unnamed == 1
    assert ds.classes == ("cat", "dog")
    assert list(ds.samples.labels) == [0, 0, 1]
    assert ds.extras is not None
    assert ds.extras.columns["label"] == ["cat", "cat", "dog"]
    assert [o.key if o else None for o in ds.extras.sidecars["txt"]] == ["a/1.txt", None, None]
    folder = build_dataset(_objects(keys), "folder", metadata=meta)
    assert folder.classes == ("a", "b")
    with pytest.raises(ValueError, match="has no such column"):
        build_dataset(_objects(keys), "species", metadata=meta)
    with pytest.raises(ValueError, match="a column of a metadata file, and there is none"):
        build_dataset(_objects(keys), "label")
    gap = read_metadata(
        b'{"file_name": "a/1.jpg"}\n{"file_name": "b/2.jpg", "label": 1}\n', "metadata.jsonl"
    )
    with pytest.raises(ValueError, match=r"gives no 'label' for 'a/1\.jpg'"):
        build_dataset(_objects(keys), "label", metadata=gap)


def test_each_folder_s_metadata_file_is_found_and_the_root_s_comes_first() -> None:
    keys = [
        "b/metadata.csv",
        "b/metadata.jsonl",  # a folder with two kinds: the first of jsonl, csv, parquet
        "metadata.parquet",
        "a/deep/metadata.jsonl",
        "a/metadata.txt",
        "a/x.jpg",
        "notmetadata.jsonl",
    ]
    found = metadata_objects(ObjectList.of(_objects(keys)))
    assert [o.key for o in found] == [
        "metadata.parquet",
        "a/deep/metadata.jsonl",
        "b/metadata.jsonl",
    ]
    assert [o.etag for o in found] == ["e2", "e3", "e1"]  # the listed objects themselves
    assert metadata_objects(ObjectList.of(_objects(["a/x.jpg"]))) == []


def test_a_folder_s_metadata_file_names_images_in_its_folder() -> None:
    meta = read_metadata(
        b'{"file_name": "1.jpg", "caption": "one"}\n'
        b'{"file_name": "/deeper/2.jpg"}\n'
        b'{"file_name": "../up.jpg"}\n',
        "a/b/metadata.jsonl",
    )
    assert meta.file_names == ["a/b/1.jpg", "a/b/deeper/2.jpg", "a/up.jpg"]
    with pytest.raises(ValueError, match=r"a/b/metadata\.jsonl:2: 'a/b/1\.jpg' is named twice"):
        read_metadata(b'{"file_name": "1.jpg"}\n{"file_name": "./1.jpg"}\n', "a/b/metadata.jsonl")
    other = read_metadata(b'{"file_name": "b/1.jpg", "n": 1}\n', "a/metadata.jsonl")
    with pytest.raises(
        ValueError, match=r"'a/b/1\.jpg' is named by both a/b/metadata\.jsonl and a/metadata"
    ):
        merge_metadata([meta, other])


_FOLDERS = st.sampled_from(["", "p1", "p2", "p2/q"])


@given(
    rows=st.lists(
        st.tuples(
            _FOLDERS,
            st.text(alphabet="abc", min_size=1, max_size=3),
            st.one_of(st.none(), st.integers(0, 9)),
            st.one_of(st.none(), st.text(alphabet="xy", max_size=2)),
        ),
        max_size=20,
        unique_by=lambda r: (r[0], r[1]),
    )
)
def test_metadata_split_across_folders_is_the_root_file_s_table(
    rows: list[tuple[str, str, int | None, str | None]],
) -> None:
    """One root file, or the same rows kept in each image's folder (each naming its images
    relative to it, each with only the columns its rows have): the same images, each with
    the same values, a column a file lacks being None."""

    def line(file_name: str, score: int | None, caption: str | None) -> bytes:
        row: dict[str, Any] = {"file_name": file_name}
        if score is not None:
            row["score"] = score
        if caption is not None:
            row["caption"] = caption
        return (json.dumps(row) + "\n").encode()

    def table(meta: Any) -> dict[str, tuple[Any, ...]]:
        names = sorted(meta.columns)
        at = {c: meta.columns[c] for c in names}
        return {
            f: tuple((c, at[c][i]) for c in names if at[c][i] is not None)
            for i, f in enumerate(meta.file_names)
        }

    whole = b"".join(
        line(f"{folder}/{stem}.jpg" if folder else f"{stem}.jpg", s, c)
        for folder, stem, s, c in rows
    )
    parts = []
    for folder in sorted({r[0] for r in rows}):
        data = b"".join(line(f"{stem}.jpg", s, c) for f, stem, s, c in rows if f == folder)
        parts.append(
            read_metadata(data, f"{folder}/metadata.jsonl" if folder else "metadata.jsonl")
        )
    merged = merge_metadata(parts) if parts else read_metadata(b"", "metadata.jsonl")
    assert table(merged) == table(read_metadata(whole, "metadata.jsonl"))
    assert sorted(merged.file_names) == sorted(read_metadata(whole, "metadata.jsonl").file_names)


@given(
    names=st.dictionaries(
        st.tuples(_FOLDERS, st.text(alphabet="ab", min_size=1, max_size=3)),
        st.tuples(st.sampled_from([".jpg", ".md"]), st.sampled_from(["there", "-1", "unlisted"])),
        max_size=16,
    ),
    broken=st.sampled_from(["", "p1", None]),
)
def test_the_names_no_object_has_are_those_a_run_would_find_missing(
    names: dict[tuple[str, str], tuple[str, str]], broken: str | None
) -> None:
    """Each folder's file names its images; the listing has some of them, some listed with
    size -1 (not there): the images named and not there are those, sorted, whatever the
    folders; a file that cannot be read is an error of its own, its names unread, and the
    others are still checked."""
    files: dict[str, bytes] = {}
    listed: list[ObjectInfo] = []
    expected = []
    for (folder, stem), (suffix, where) in names.items():
        at = f"{folder}/" if folder else ""
        key = f"{at}{stem}{suffix}"
        files.setdefault(f"{at}metadata.jsonl", b"")
        files[f"{at}metadata.jsonl"] += (json.dumps({"file_name": stem + suffix}) + "\n").encode()
        if where != "unlisted":
            listed.append(ObjectInfo(key, 10 if where == "there" else -1, "e"))
        if where != "there" and suffix == ".jpg" and folder != broken:
            expected.append(key)
    bad = f"{broken}/metadata.jsonl" if broken else "metadata.jsonl"
    if broken is not None and bad in files:
        files[bad] += b"{not json\n"
    missing, errors = named_not_there(
        sorted(files.items()), listed, lambda key: key.endswith(".jpg")
    )
    assert missing == sorted(expected)
    assert [key for key, _ in errors] == ([bad] if broken is not None and bad in files else [])


def test_an_extra_that_names_nothing_is_an_error_that_says_what_there_is() -> None:
    listed = {k: o for k, o in zip(["a.jpg", "a.txt"], _objects(["a.jpg", "a.txt"]), strict=True)}
    got = resolve_extras(
        ["txt", ".txt", "source"], ["a.jpg"], listed, source="s3://b/", metadata=None, rows=None
    )
    assert got.columns == {"source": ["s3://b/"]}
    assert got.sidecars["txt"] == got.sidecars[".txt"] == [listed["a.txt"]]
    with pytest.raises(
        ValueError, match=r"'caption'.*no object under s3://b/ ends with '\.caption'"
    ):
        resolve_extras(["caption"], ["a.jpg"], listed, source="s3://b/", metadata=None, rows=None)


# --- through the loader, on every store -------------------------------------------------


@pytest.fixture(scope="module")
def captioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Images in two class folders with: a metadata.jsonl naming all but one, an ``idx``
    (unique: the sample's identity) and a caption; ``.txt`` captions beside all but every
    fifth image; ``.json`` beside every image, one of them malformed."""
    root = tmp_path_factory.mktemp("captioned")
    rows = []
    for i, name in enumerate(_names()):
        path = root / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(_jpeg(i))
        if i % 5:
            path.with_suffix(".txt").write_text(_caption(i), encoding="utf-8")
        meta = {"i": i, "tags": ["x"] * (i % 3)} if i != 7 else None
        path.with_suffix(".json").write_text(json.dumps(meta) if meta else "{not json")
        if i != N - 1:
            rows.append({"file_name": name, "idx": i, "caption": _caption(i)})
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def captioned_url(backend: Backend, captioned: Path) -> str:
    bucket = "captions"
    backend.create_bucket(bucket)
    for path in sorted(captioned.rglob("*")):
        if path.is_file():
            backend.put(bucket, "set/" + path.relative_to(captioned).as_posix(), path.read_bytes())
    return backend.url(bucket, "set/")


def _epoch(loader: al.ImageLoader) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for batch in loader:
        _images, labels, extras = batch  # type: ignore[misc]
        assert set(extras) == set(loader._run_config.extras)
        for k, label in enumerate(labels.tolist()):
            assert all(len(v) == len(labels) for v in extras.values())
            out.append((label, {n: v[k] for n, v in extras.items()}))
    return out


def test_captions_from_metadata_jsonl_come_in_batch_order(
    backend: Backend, captioned_url: str
) -> None:
    """``labels="idx"`` (a column) gives each sample its identity: every sample's caption
    and source are its own, the image the metadata does not name is left out."""
    with al.ImageLoader(
        captioned_url,
        batch_size=5,
        labels="idx",
        extras=("caption", "source"),
        engine=al.EngineConfig(processes=2),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options=backend.store_options),
    ) as loader:
        got = _epoch(loader)
        assert loader.engine_processes == 2
    assert sorted(i for i, _ in got) == list(range(N - 1))
    for i, extras in got:
        assert extras == {"caption": _caption(i), "source": captioned_url}


def test_sidecars_are_fetched_with_their_image_and_cached_with_it(
    backend: Backend, captioned_url: str, tmp_path: Path
) -> None:
    """``.txt`` sidecars as captions (None where there is none), ``.json`` parsed; the
    malformed one is skipped under ``on_error="skip"`` and counted; the second epoch reads
    every sidecar from the SSD cache."""
    names = _names()
    index = {n: i for i, n in enumerate(names)}
    with al.ImageLoader(
        captioned_url,
        batch_size=4,
        labels=index.__getitem__,
        extras=("txt", "json"),
        cache_dir=str(tmp_path),
        store=al.StoreConfig(extensions=(".jpg",), options=backend.store_options),
        errors=al.ErrorConfig(on_error="skip", max_failures=1),
        decode=al.DecodeConfig(workers=2),
    ) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            got = _epoch(loader)
            # The metadata file names the samples (not the last image), and one is skipped.
            assert sorted(i for i, _ in got) == [i for i in range(N - 1) if i != 7]
            for i, extras in got:
                assert extras["txt"] == (_caption(i) if i % 5 else None)
                assert extras["json"] == {"i": i, "tags": ["x"] * (i % 3)}
            if epoch == 0:
                first = loader.stats()
        stats = loader.stats()
    assert first.skipped == {"DecodeError": 1}
    assert first.skipped_keys == ("cat/007.jpg",)  # the sample whose sidecar failed
    sidecars = sum(1 for i in range(N - 1) if i % 5) + N - 1  # .txt and .json that exist
    # Each fetched once (the engine runs ahead into the next epochs meanwhile: those
    # reads are the cache's), and epoch 1 read every one from the cache.
    assert first.sidecars_fetched == stats.sidecars_fetched == sidecars
    assert stats.sidecars_cached >= sidecars
    assert f"sidecar files: {sidecars} fetched, " in stats.summary()
    assert stats.unnamed_images == 1  # the image the metadata file does not name
    assert "images left out, not named by the metadata file: 1" in stats.summary()


def test_a_malformed_sidecar_under_raise_names_it(backend: Backend, captioned_url: str) -> None:
    with al.ImageLoader(
        captioned_url,
        batch_size=8,
        shuffle=False,
        extras=("json",),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options=backend.store_options),
    ) as loader:
        with pytest.raises(al.DecodeError, match=r"sidecar .*007\.json: not JSON"):
            for _ in loader:
                pass


def test_extras_through_a_dataloader_and_to_device(backend: Backend, captioned_url: str) -> None:
    """``ImageDataset`` in a DataLoader, then ``to_device``: the extras come through."""
    if backend.name != "s3":
        pytest.skip("one store is enough for the torch face")
    import torch.utils.data

    from asyncloader.torch import ImageDataset, to_device

    dataset = ImageDataset(
        captioned_url,
        batch_size=6,
        labels="idx",
        extras=("caption",),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options=backend.store_options),
    )
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1)
    seen = []
    for images, labels, extras in to_device(dl, device="cpu", dtype="uint8"):  # type: ignore[misc]
        assert images.dtype == np.uint8 or str(images.dtype) == "torch.uint8"
        seen += [(i, c) for i, c in zip(labels.tolist(), extras["caption"], strict=True)]
    assert sorted(seen) == [(i, _caption(i)) for i in range(N - 1)]


def test_extras_with_a_columnar_manifest_are_refused(tmp_path: Path) -> None:
    """A columnar manifest names the samples only: no sidecar or metadata file to read."""
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "1.jpg").write_bytes(_jpeg(1))
    (tmp_path / "cat" / "1.txt").write_text("a cat")
    al.describe(str(tmp_path), write_manifest=str(tmp_path / "m.npz"))
    with pytest.raises(ValueError, match="columnar manifest"):
        with al.ImageLoader(
            str(tmp_path), labels=str(tmp_path / "m.npz"), extras=("txt",)
        ) as loader:
            next(iter(loader))
