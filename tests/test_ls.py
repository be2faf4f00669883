"""``asyncloader ls`` / ``describe``: what is under a URL, from the saved listing when there
is one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._tools._describe import inventory
from asyncloader.testing import FaultProxy, MotoServer, S3TestServer

from .conftest import N_CLASSES, N_IMAGES, Backend


def test_describe_a_folder(jpeg_folder: Path) -> None:
    inv = al.describe(str(jpeg_folder))
    sizes = sorted(p.stat().st_size for p in jpeg_folder.rglob("*.jpg"))
    assert inv.samples == N_IMAGES and inv.sample_bytes == sum(sizes)
    assert inv.classes == {f"class_{i:02d}": N_IMAGES // N_CLASSES for i in range(N_CLASSES)}
    assert inv.extensions[".jpg"] == N_IMAGES
    p = inv.size_percentiles
    assert sizes[0] <= p["p50"] <= p["p90"] <= p["p99"] <= p["max"] == sizes[-1]
    assert not inv.from_saved_listing
    assert f"samples: {N_IMAGES}" in inv.summary()


def test_ls_names_the_metadata_files_a_loader_reads() -> None:
    objects = [
        al.ObjectInfo(key, 10)
        for key in (
            "part-2/metadata.csv",
            "part-2/0.jpg",
            "part-1/metadata.jsonl",
            "part-1/0.jpg",
            "metadata.parquet",
            "notes/readme.txt",
        )
    ]
    inv = inventory("s3://b/caps/", objects)
    assert inv.metadata_files == [
        "metadata.parquet",
        "part-1/metadata.jsonl",
        "part-2/metadata.csv",
    ]
    assert "metadata files: 3 (metadata.parquet, part-1/metadata.jsonl, part-2/metadata.csv)" in (
        inv.summary()
    )
    plain = inventory("s3://b/caps/", objects[1:2])
    assert plain.metadata_files == [] and "metadata files" not in plain.summary()


def test_presigned_keys_are_counted_by_their_path() -> None:
    objects = [
        al.ObjectInfo("https://h/b/a/1.jpg?X-Amz-Signature=abc", 10),
        al.ObjectInfo("https://h/b/a/2.JPG?X-Amz-Signature=def", 30),
        al.ObjectInfo("https://h/b/notes.txt?X-Amz-Signature=ghi", 5),
    ]
    inv = inventory("https://h/b/", objects)
    assert inv.samples == 2 and inv.sample_bytes == 40 and inv.bytes == 45
    assert inv.extensions == {".jpg": 2, ".txt": 1}


def test_ls_reads_the_saved_listing(light_server: S3TestServer, tmp_path: Path) -> None:
    def ls(*extra: str) -> dict[str, object]:
        out = subprocess.run(
            [
                *(sys.executable, "-m", "asyncloader", "ls", "s3://b/train/", "--json"),
                *("--endpoint-url", light_server.endpoint, "--cache-dir", str(tmp_path)),
                *extra,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        result: dict[str, object] = json.loads(out.stdout)
        return result

    first = ls()
    lists = light_server.stats()["counters"]["list"]
    second = ls()
    assert light_server.stats()["counters"]["list"] == lists  # no LIST request this time
    assert second["from_saved_listing"] and not first["from_saved_listing"]
    assert first["samples"] == second["samples"] == N_IMAGES
    assert first["classes"] == second["classes"]
    assert ls("--refresh-listing")["from_saved_listing"] is False


def test_a_written_manifest_is_read_instead_of_a_listing(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """``ls --write-manifest``: the samples with their folder label, size and ETag; a loader
    given it as ``labels=`` lists nothing and delivers what a folder-labelled loader does."""
    import numpy as np

    manifest = tmp_path / "train.jsonl"
    out = subprocess.run(
        [
            *(sys.executable, "-m", "asyncloader", "ls", "s3://b/train/"),
            *("--endpoint-url", light_server.endpoint, "--write-manifest", str(manifest)),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert len(rows) == N_IMAGES and all(set(r) == {"key", "label", "size", "etag"} for r in rows)
    assert {r["label"] for r in rows} == {f"class_{i:02d}" for i in range(N_CLASSES)}

    def epoch(labels: str) -> tuple[list[int], np.ndarray]:
        with al.ImageLoader(
            "s3://b/train/",
            labels=labels,
            batch_size=16,
            seed=4,
            store=al.StoreConfig(options={"endpoint_url": light_server.endpoint}),
        ) as loader:
            got = [(lab.tolist(), img.numpy().copy()) for img, lab in loader]
        return [x for lab, _ in got for x in lab], np.concatenate([img for _, img in got])

    light_server.reset_stats()
    labels, pixels = epoch(str(manifest))
    assert light_server.stats()["counters"].get("list", 0) == 0  # no LIST request
    folder_labels, folder_pixels = epoch("folder")
    assert labels == folder_labels and np.array_equal(pixels, folder_pixels)
    assert al.listing("s3://b/train/", labels=str(manifest)) == [
        al.ObjectInfo(r["key"], r["size"], r["etag"]) for r in rows
    ]

    # The same as arrays (.npz): the same samples, labels and pixels, still no LIST.
    columnar = tmp_path / "train.npz"
    al.describe(
        "s3://b/train/",
        store_options={"endpoint_url": light_server.endpoint},
        write_manifest=columnar,
    )
    light_server.reset_stats()
    npz_labels, npz_pixels = epoch(str(columnar))
    assert light_server.stats()["counters"].get("list", 0) == 0
    assert npz_labels == folder_labels and np.array_equal(npz_pixels, folder_pixels)
    assert al.listing("s3://b/train/", labels=str(columnar)) == al.listing(
        "s3://b/train/", labels=str(manifest)
    )
    with al.ImageLoader(
        "s3://b/train/",
        labels=str(columnar),
        store=al.StoreConfig(options={"endpoint_url": light_server.endpoint}),
    ) as loader:
        assert loader.classes == tuple(f"class_{i:02d}" for i in range(N_CLASSES))
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(columnar.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a columnar manifest"):
        al.ImageLoader(
            "s3://b/train/",
            labels=str(damaged),
            store=al.StoreConfig(options={"endpoint_url": light_server.endpoint}),
        )


def test_a_manifest_reads_the_same_whole_or_line_by_line() -> None:
    """The one-call parse of a plain JSONL manifest gives the rows the line-by-line parse
    gives (numbers as their text), and a file it cannot take goes line by line."""
    from asyncloader._base import _manifest

    plain = b'{"key": "a/1.jpg", "label": 3, "size": 5, "etag": "e"}\n{"key": "b", "w": 1.50}\n'
    fancy = b'{"key": "a/1.jpg", "label": 3, "size": 5, "etag": "e"}\r\n\r\n{"key": "b", "w": 1.50, "x": null}\n'
    whole = _manifest.read_manifest(plain, "m.jsonl")
    assert whole == _manifest.read_manifest(fancy, "m.jsonl")
    assert whole == [
        {"key": "a/1.jpg", "label": "3", "size": "5", "etag": "e"},
        {"key": "b", "w": "1.5"},
    ]
    with pytest.raises(ValueError, match=r"m\.jsonl:2: expected \{'key'"):
        _manifest.read_manifest(b'{"key": "a"}\n{"label": 1}\n', "m.jsonl")
    with pytest.raises(ValueError, match=r"m\.jsonl:3: expected a JSON object"):
        _manifest.read_manifest(b'{"key": "a"}\n\n{"key":\n', "m.jsonl")


# What each service's listing request carries (a listing refused there shows a LIST).
_LIST_MARK = {"s3": "list-type=2", "azure": "comp=list", "gcs": "maxResults"}


def test_a_manifest_published_next_to_the_data_replaces_the_listing(
    backend: Backend, jpeg_folder: Path
) -> None:
    """``ls --write-manifest URL`` on each service's emulator: the manifest is uploaded (a
    throttled upload is sent again) under the data's URL or beside it, and a loader given
    that URL as ``labels=`` lists nothing and delivers what a folder-labelled loader does."""
    import numpy as np

    # A container of this test's own: the servers are shared by every test of a process.
    backend.create_bucket("published")
    backend.server.upload_folder("published", jpeg_folder, "train/")
    data = backend.url("published", "train/")
    under, beside = data + "train.jsonl", backend.url("published", "lists/train.npz")
    with FaultProxy(backend.server.endpoint) as proxy:
        options = backend.options_at(proxy.endpoint)
        if backend.name == "s3":  # the CLI, and the upload on aiohttp (as behind a proxy)
            out = subprocess.run(
                [
                    *(sys.executable, "-m", "asyncloader", "ls", data),
                    *("--endpoint-url", proxy.endpoint, "--write-manifest", under),
                ],
                capture_output=True,
                text=True,
            )
            assert out.returncode == 0, out.stderr
            options = {**options, "http_client": "aiohttp"}
        else:
            al.describe(data, store_options=options, write_manifest=under)
        proxy.fail_next(1, status=503, code="SlowDown", path_contains="lists/train.npz")
        al.describe(data, store_options=options, write_manifest=beside)
        assert proxy.injected == 1

        def epoch(labels: str) -> tuple[list[int], np.ndarray]:
            with al.ImageLoader(
                data,
                labels=labels,
                batch_size=16,
                seed=4,
                store=al.StoreConfig(options=options),
            ) as loader:
                got = [(lab.tolist(), img.numpy().copy()) for img, lab in loader]
            return [x for lab, _ in got for x in lab], np.concatenate([img for _, img in got])

        listed = [o for o in al.listing(data, store_options=options) if o.key.endswith(".jpg")]
        folder_labels, folder_pixels = epoch("folder")
        proxy.fail_next(
            10**6, status=403, code="AccessDenied", path_contains=_LIST_MARK[backend.name]
        )
        for manifest in (under, beside):
            assert al.listing(data, labels=manifest, store_options=options) == listed
            labels, pixels = epoch(manifest)
            assert labels == folder_labels and np.array_equal(pixels, folder_pixels)
        with pytest.raises(al.AccessDenied):  # the listing is refused from here on
            al.listing(data, store_options=options, refresh_listing=True)


def test_where_a_manifest_cannot_be_written(light_server: S3TestServer, tmp_path: Path) -> None:
    options = {"endpoint_url": light_server.endpoint}
    with pytest.raises(ValueError, match=r"\.jsonl file .* or a \.npz file"):
        al.describe("s3://b/train/", store_options=options, write_manifest=tmp_path / "m.csv")
    with pytest.raises(al.StoreError, match="takes no uploads"):
        al.describe("s3://b/train/", store_options=options, write_manifest="https://h.test/m.npz")
    # A file:// URL and a local path are written whole, folders made as needed.
    target = tmp_path / "sub" / "m.npz"
    al.describe("s3://b/train/", store_options=options, write_manifest=target.as_uri())
    assert al.listing("s3://b/train/", labels=target.as_uri(), store_options=options) == (
        al.listing("s3://b/train/", store_options=options)
    )
    assert [p.name for p in target.parent.iterdir()] == ["m.npz"]  # no temporary file left


def test_store_options_on_the_command_line_and_errors_without_tracebacks(
    light_server: S3TestServer,
) -> None:
    light_server.set_requester_pays("b")

    def ls(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "asyncloader", "ls", "s3://b/train/", "--json"]
        cmd += ["--endpoint-url", light_server.endpoint, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    ok = ls("-o", "requester_pays=true", "--store-option", "read_timeout=30")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["samples"] == N_IMAGES
    # What the user can fix is one message and exit status 1, not a traceback.
    refused = ls()
    assert refused.returncode == 1
    assert refused.stderr.startswith("asyncloader ls: AccessDenied: access denied to s3://b/")
    assert "Traceback" not in refused.stderr
    unknown = ls("-o", "requester_pay=true")
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert "unknown store option 'requester_pay' for s3:// (S3Store takes" in unknown.stderr
    assert "requester_pays" in unknown.stderr


def test_store_option_values_and_unknown_options() -> None:
    from asyncloader._tools._args import parse_store_option

    assert parse_store_option("requester_pays=true") == ("requester_pays", True)
    assert parse_store_option("anonymous=False") == ("anonymous", False)
    assert parse_store_option("max_connections=512") == ("max_connections", 512)
    assert parse_store_option("read_timeout=2.5") == ("read_timeout", 2.5)
    assert parse_store_option("region=eu-west-1") == ("region", "eu-west-1")
    assert parse_store_option("sas_token=sv=1&sig=a=") == ("sas_token", "sv=1&sig=a=")
    with pytest.raises(ValueError, match=r"LocalStore takes no options"):
        al.ImageLoader(
            "/tmp/",
            store=al.StoreConfig(options={"region": "x"}),
        )
    with pytest.raises(ValueError, match=r"unknown store option 'regoin' for gs://"):
        al.listing("gs://b/x/", store_options={"regoin": "x"})


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ([0, 4, 2, None], "whole numbers 0 … 4, 1 empty"),
        ([0.5, 9.75, float("nan")], "numbers 0.5 … 9.75"),
        (["cat", "dog", "cat"], "text: 'cat', 'dog'"),
        ([f"caption {i}" for i in range(1000)], "text, 1,000 distinct"),
        (["3", "10.5", None, None], "text of numbers 3 … 10.5, 2 empty"),  # a CSV's numbers
        (["3", "ten"], "text: '3', 'ten'"),
        ([True, False], "true/false"),
        ([["a"], ["b", "c", "d"]], "lists of 1 … 3"),
        ([{"k": 1}], "objects"),
        ([1, "one", 2], "mixed: 2 whole numbers, 1 text"),
        ([None, None], "empty"),
        ([], "no rows"),
    ],
)
def test_a_metadata_column_is_described_by_its_kind_and_range(
    values: list[object], says: str
) -> None:
    from asyncloader._tools._columns import describe_column

    assert describe_column(values) == says


@given(
    st.lists(
        st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=32)),
        min_size=1,
    )
)
def test_a_number_column_s_range_and_empty_rows_are_its_own(values: list[float | None]) -> None:
    from asyncloader._tools._columns import describe_column

    present = [v for v in values if v is not None]
    empty = len(values) - len(present)
    said = describe_column(values)
    if not present:
        assert said == "empty"
        return
    assert said.startswith(f"numbers {min(present):g} … {max(present):g}")
    assert said.endswith(f", {empty:,} empty") == bool(empty)


def test_the_metadata_report_meets_the_listing() -> None:
    from asyncloader._dataset._labels import IMAGE_EXTENSIONS, KeyFilter
    from asyncloader._dataset._metadata import read_metadata
    from asyncloader._tools._columns import metadata_report

    rows = [{"file_name": f"{i}.jpg", "score": i} for i in range(8)]
    rows.append({"file_name": "notes.txt", "score": 0})  # not an image: not a sample
    meta = read_metadata("".join(json.dumps(r) + "\n" for r in rows).encode(), "metadata.jsonl")
    listed = {f"{i}.jpg" for i in range(8) if i not in (2, 6, 7)} | {"extra.jpg", "notes.txt"}
    report = metadata_report(meta, listed, KeyFilter(IMAGE_EXTENSIONS))
    assert (report.rows, report.listed, report.not_listed) == (9, 5, 3)
    assert report.not_listed_names == ["2.jpg", "6.jpg", "7.jpg"]
    assert report.unnamed == 1  # extra.jpg
    assert report.columns == {"score": "whole numbers 0 … 7"}
    text = "\n".join(report.lines())
    assert "naming one not there: 3 (2.jpg, 6.jpg, 7.jpg: missing when read)" in text
    assert "images here no row names: 1 (left out)" in text
    assert "filters= also takes: size, file_name, width, height" in text


def test_ls_reads_the_metadata_files_as_a_loader_would_and_keeps_them(
    moto: MotoServer, tmp_path: Path
) -> None:
    """``ls`` of a captioned folder on S3: the root's ``metadata.jsonl`` and a folder's
    ``metadata.csv`` read as one table (the columns, the name no object has, the image no
    row names), kept in the cache folder so that a loader on it reads them from the disk;
    a malformed file is one message naming its line, and exit status 1."""
    from io import BytesIO

    from PIL import Image

    bucket = "ls-captions"
    moto.create_bucket(bucket)
    for key in ("0.jpg", "1.jpg", "part/2.jpg", "part/3.jpg", "stray.jpg"):
        buf = BytesIO()
        Image.new("RGB", (32, 24), (10, 90, 160)).save(buf, "JPEG")
        moto.put(bucket, f"set/{key}", buf.getvalue())
    root = [{"file_name": f"{i}.jpg", "text": f"a photo {i}", "aesthetic": 4.5 + i} for i in (0, 1)]
    moto.put(bucket, "set/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in root).encode())
    moto.put(bucket, "set/part/metadata.csv", b"file_name,text\n2.jpg,two\n9.jpg,nine\n")
    url, cache = f"s3://{bucket}/set/", tmp_path / "cache"

    def ls(endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "asyncloader", "ls", url, "--cache-dir", str(cache)]
        cmd += ["--endpoint-url", endpoint, *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    with FaultProxy(moto.endpoint) as proxy:
        out = ls(proxy.endpoint, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)["metadata"]
        assert report["rows"] == 4 and report["listed"] == 3
        assert (report["not_listed"], report["not_listed_names"]) == (1, ["part/9.jpg"])
        assert report["unnamed"] == 2  # part/3.jpg and stray.jpg
        assert report["columns"] == {
            "text": "text: 'a photo 0', 'a photo 1', 'nine', 'two'",
            "aesthetic": "numbers 4.5 … 5.5, 2 empty",  # the CSV has no such column
        }
        assert proxy.targets[f"GET /{bucket}/set/metadata.jsonl"] == 1
        words = ls(proxy.endpoint)
        assert "column aesthetic: numbers 4.5 … 5.5, 2 empty" in words.stdout
        assert "naming one not there: 1 (part/9.jpg" in words.stdout
        assert proxy.targets[f"GET /{bucket}/set/metadata.jsonl"] == 1  # kept: read again there
        with al.ImageLoader(
            url,
            batch_size=1,
            labels=None,
            extras=("text",),
            cache_dir=str(cache),
            store=al.StoreConfig(options={"endpoint_url": proxy.endpoint}),
            errors=al.ErrorConfig(on_error="skip", max_failures=1),
        ) as loader:
            texts = sorted(t for _, _, extras in loader for t in extras["text"])
        assert texts == ["a photo 0", "a photo 1", "two"]
        assert proxy.targets[f"GET /{bucket}/set/metadata.jsonl"] == 1
        assert proxy.targets[f"GET /{bucket}/set/part/metadata.csv"] == 1
    moto.put(bucket, "set/metadata.jsonl", b'{"file_name": "0.jpg"}\n{oops\n')
    bad = ls(moto.endpoint, "--refresh-listing")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "metadata.jsonl:2: not JSON" in bad.stderr
    plain = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import asyncloader as al; print(al.describe({url!r}, "
            f"store_options={{'endpoint_url': {moto.endpoint!r}}}, metadata=False).metadata)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.stdout.strip() == "None", plain.stderr


def test_ls_of_a_web_folder_counts_a_name_the_server_lacks_as_not_there(tmp_path: Path) -> None:
    """On a plain web server the metadata file lists the folder, each image sized by a
    HEAD: a name whose HEAD finds nothing is reported as not there, not as listed."""
    from PIL import Image

    from asyncloader.testing import PythonHTTPServer

    site = tmp_path / "site" / "c"
    site.mkdir(parents=True)
    rows = [{"file_name": f"{i}.jpg", "score": i} for i in range(5)]
    for i in (0, 1, 3, 4):
        Image.new("RGB", (20, 10), (9, 9, 9)).save(site / f"{i}.jpg")
    (site / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with PythonHTTPServer(tmp_path / "site") as server:
        inv = al.describe(f"{server.endpoint}/c/")
    assert inv.metadata is not None
    assert (inv.metadata.rows, inv.metadata.listed, inv.metadata.not_listed) == (5, 4, 1)
    assert inv.metadata.not_listed_names == ["2.jpg"]
    assert inv.metadata.columns == {"score": "whole numbers 0 … 4"}
    assert (inv.objects, inv.samples) == (5, 4)  # the file and the four images there
