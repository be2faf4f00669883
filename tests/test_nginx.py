"""Servers as they are: nginx (Debian's, started by the tests) in the configurations a
dataset meets behind it, read by the loader and its fetcher; what nginx sent is read back
from its access log.  Skipped, saying so, where nginx is not installed (``.ci/run``
installs it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._base._stats import Counters
from asyncloader._fetch import Fetcher
from asyncloader._stores import open_store
from asyncloader._stores._http_objects import parse_content_range
from asyncloader.testing import MotoServer, Nginx, find_nginx

from ._captions import caption_folder, class_captions, class_cut, class_epoch, class_site
from .conftest import N_IMAGES, Backend, listed_keys

pytestmark = pytest.mark.skipif(
    find_nginx() is None and not os.environ.get("ASYNCLOADER_REQUIRE_NGINX"),
    reason="nginx is not installed (apt-get install nginx-light; .ci/run installs it)",
)

# Parts small enough that the photos of the test folder (50-200 KB) take the ranged path.
PARTS = al.FetchConfig(range_threshold=96 << 10, part_size=32 << 10)
IGNORE_RANGES = "max_ranges 0;"


def _images(jpeg_folder: Path) -> dict[str, int]:
    return {
        f"/train/{p.relative_to(jpeg_folder).as_posix()}": p.stat().st_size
        for p in jpeg_folder.rglob("*.jpg")
    }


def _read_all(endpoint: str, cache: Path, **options: object) -> al.Stats:
    """One epoch over the site, with an SSD cache (the next epoch, prefetched while this
    one ends, reads the cache, not the server)."""
    options = {"manifest": f"{endpoint}/train.jsonl", **options}
    store = al.StoreConfig(options=options)
    with al.ImageLoader(
        f"{endpoint}/train/",
        batch_size=16,
        transform=al.Resize(32),
        store=store,
        fetch=PARTS,
        shuffle=False,
        errors=al.ErrorConfig(on_error="skip", max_failures=2),
        cache_dir=cache,
    ) as loader:
        labels = Counter(int(x) for _, batch in loader for x in batch)
        assert sum(labels.values()) + sum(loader.stats().skipped.values()) >= N_IMAGES
    return loader.stats()  # once closed: the next epoch's requests, prefetched, counted too


@pytest.mark.parametrize("server", ["", IGNORE_RANGES], ids=["ranges", "max_ranges-0"])
def test_each_image_streams_once_whether_or_not_the_server_honours_ranges(
    site: Path, jpeg_folder: Path, server: str, tmp_path: Path
) -> None:
    """Against nginx answering a range with the whole file (200), every image is fetched
    in one GET, once; where it honours ranges, the large ones in parts.  Either way the
    requests' answers move no more than 1.1 x the images' bytes.  A request sent again is
    a hedge (a slow answer on a busy machine: at most about 5 % of the requests, each a
    whole image where ranges are ignored) or a retry, of the same range: the loader counts
    each, and its bytes are not in the bound."""
    with Nginx(site, server=server) as nginx:
        stats = _read_all(nginx.endpoint, tmp_path)
        gets = [a for a in nginx.answers() if a.method == "GET" and a.path.endswith(".jpg")]
    images = _images(jpeg_folder)
    assert stats.samples == N_IMAGES and not stats.skipped
    answered: dict[tuple[str, str], int] = {}  # each request's first answer
    for a in gets:
        answered.setdefault((a.path, a.range), a.body_bytes)
    assert sum(answered.values()) <= 1.1 * sum(images.values())
    per_image = Counter(a.path for a in gets)
    assert set(per_image) == set(images)
    large = [path for path, size in images.items() if size > PARTS.range_threshold]
    assert large  # the folder has images that take the ranged path
    asked = {(a.path, a.range) for a in gets}  # each request once, whatever was sent again
    if server == IGNORE_RANGES:
        assert Counter(path for path, _ in asked) == Counter(set(images))  # one range each
        assert all(a.status == 200 for a in gets)
    else:
        for path in large:  # ranges: a part each
            size = images[path]
            assert sum(1 for p, _ in asked if p == path) == -(-size // PARTS.part_size), path
        assert {a.status for a in gets if a.path in large} == {206}
    # A range asked again is a hedge or a retry (each counted), or the next epoch's,
    # prefetched before the loader closed, of an object the cache writer could not keep up
    # with on a busy machine (counted; at most a part a request): nothing else.
    again = len(gets) - len(asked)
    parts = -(-max(images.values()) // PARTS.part_size)
    counted = stats.hedges_sent + sum(stats.retries.values()) + parts * stats.cache_store_skipped
    assert again <= counted, (per_image.most_common(3), stats)


@pytest.mark.parametrize("server", ["", IGNORE_RANGES], ids=["ranges", "max_ranges-0"])
def test_a_missing_large_object_is_a_counted_skip(site: Path, server: str, tmp_path: Path) -> None:
    """A listed object over the range threshold that the server does not have: its parts'
    404s fail the sample, skipped and counted under on_error="skip", not the run."""
    rows = [json.loads(line) for line in (site / "train.jsonl").read_text().splitlines()]
    missing = [
        {"key": "class_00/gone.jpg", "size": 300_000},
        {"key": "zz/gone.jpg", "size": 300_000},
    ]
    manifest = tmp_path / "with-missing.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in missing + rows))
    with Nginx(site, server=server) as nginx:
        stats = _read_all(nginx.endpoint, tmp_path / "cache", manifest=str(manifest))
    assert stats.samples == N_IMAGES
    assert stats.skipped == {"ObjectNotFound": 2}
    assert sorted(stats.skipped_keys) == ["class_00/gone.jpg", "zz/gone.jpg"]


@pytest.fixture(scope="module")
def large_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three files of 20-40 MB (random bytes) and a small one."""
    root = tmp_path_factory.mktemp("large")
    for name, size in (
        ("a.bin", 20 << 20),
        ("b.bin", 29 << 20),
        ("c.bin", 40 << 20),
        ("d.bin", 5000),
    ):
        (root / name).write_bytes(os.urandom(size))
    return root


def test_large_objects_at_once_from_a_server_that_ignores_ranges(large_files: Path) -> None:
    """The loader's default parts (8 MiB above 16 MiB), three large objects asked for at
    once: the first part of the first alone learns that the server sends whole files, the
    others wait for it; each file moves once, byte for byte."""
    with Nginx(large_files, server=IGNORE_RANGES) as nginx:

        async def main() -> list[bytes]:
            store = al.HttpStore(f"{nginx.endpoint}/")
            fetcher = Fetcher(store, Counters(), al.FetchConfig())
            try:
                infos = [await store.stat(n) for n in ("a.bin", "b.bin", "c.bin", "d.bin")]
                return [bytes(b) for b in await asyncio.gather(*map(fetcher.fetch, infos))]
            finally:
                fetcher.close()
                await store.close()

        got = asyncio.run(main())
        answers = [a for a in nginx.answers() if a.method == "GET"]
    for name, data in zip(("a.bin", "b.bin", "c.bin", "d.bin"), got, strict=True):
        assert data == (large_files / name).read_bytes(), name
    assert sorted(a.path for a in answers) == ["/a.bin", "/b.bin", "/c.bin", "/d.bin"]
    total = sum(f.stat().st_size for f in large_files.iterdir())
    assert sum(a.body_bytes for a in answers) == total


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.one_of(st.none(), st.integers(0, 2**41)))
def test_content_range_is_read_as_written(first: int, length: int, total: int | None) -> None:
    last = first + length
    written = f"bytes {first}-{last}/{'*' if total is None else total}"
    assert parse_content_range(written) == (first, last, total)


@pytest.mark.parametrize("bad", ["bytes */100", "items 0-1/2", "bytes 1-/3", "bytes a-b/3", ""])
def test_a_content_range_that_is_no_byte_range_is_a_transient_error(bad: str) -> None:
    with pytest.raises(al.TransientStoreError, match="Content-Range"):
        parse_content_range(bad)


def test_an_s3_endpoint_with_a_path_behind_a_reverse_proxy(
    moto: MotoServer, moto_dataset: str, tmp_path: Path
) -> None:
    """moto behind nginx at ``/s3/`` (a gateway as deployed): the endpoint's path is kept
    before the bucket's, as boto3 keeps it, by the loader and by ``asyncloader ls``."""
    port = moto.endpoint.rsplit(":", 1)[1]
    proxy = f"location /s3/ {{ proxy_pass http://127.0.0.1:{port}/; proxy_set_header Host $http_host; }}"
    with Nginx(tmp_path, server=proxy) as nginx:
        endpoint = f"{nginx.endpoint}/s3"
        import boto3

        keys = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(
            Bucket="data", Prefix="train/"
        )["KeyCount"]
        assert keys == N_IMAGES  # boto3 reaches the bucket there
        store = al.StoreConfig(options={"endpoint_url": endpoint})
        with al.ImageLoader(moto_dataset, batch_size=32, store=store) as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "asyncloader",
                "ls",
                moto_dataset,
                "-o",
                f"endpoint_url={endpoint}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f"{N_IMAGES} objects" in out.stdout
        paths = {a.path.split("?")[0] for a in nginx.answers()}
    assert any(p.startswith("/s3/data/train/") for p in paths)
    assert not any(p.startswith("/data/") for p in paths)


def _forward_proxy(tmp_path: Path, origin: str) -> Nginx:
    """nginx as the forward proxy that alone reaches ``origin`` (``http://127.0.0.1:PORT``):
    the clients name the origin ``data.invalid:PORT``, a host no resolver knows."""
    port = urlsplit(origin).port
    return Nginx(tmp_path, server=f"location / {{ proxy_pass http://127.0.0.1:{port}; }}")


def _unreachable(endpoint: str) -> str:
    return endpoint.replace("127.0.0.1", "data.invalid")


def test_every_store_through_the_environment_s_proxy_alone(
    backend: Backend,
    dataset: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store's origin reachable only through HTTP_PROXY (a forward proxy the test
    starts): the loader reads every image, and the proxy saw the requests."""
    with _forward_proxy(tmp_path, backend.server.endpoint) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.endpoint)
        options = backend.options_at(_unreachable(backend.server.endpoint))
        with al.ImageLoader(
            dataset, batch_size=32, store=al.StoreConfig(options=options)
        ) as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES
        assert len(proxy.answers()) >= N_IMAGES
        # NO_PROXY names the host: the request goes direct, and finds no such host.
        monkeypatch.setenv("NO_PROXY", "localhost,.invalid")
        with pytest.raises(al.AsyncLoaderError):
            al.listing(dataset, store_options=options)


def test_ls_and_warm_of_a_web_folder_through_a_proxy_with_a_store_option(
    site: Path, tmp_path: Path
) -> None:
    """``-o proxy=`` on the command line: ls and warm of a web folder whose server only
    the proxy reaches (its credentials in the URL, never shown)."""
    with Nginx(site) as origin, _forward_proxy(tmp_path, origin.endpoint) as proxy:
        base = _unreachable(origin.endpoint)
        via = proxy.endpoint.replace("http://", "http://user:s3cr3t@")
        common = ["-o", f"proxy={via}", "-o", f"manifest={base}/train.jsonl"]
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, "-m", "asyncloader", *args, *common]
            return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)

        ls = cli("ls", f"{base}/train/")
        assert ls.returncode == 0, ls.stderr
        assert f"{N_IMAGES} objects" in ls.stdout
        warm = cli("warm", f"{base}/train/", "--cache-dir", str(tmp_path / "cache"))
        assert warm.returncode == 0, warm.stderr
        assert f"{N_IMAGES} objects warmed" in warm.stdout
        assert "s3cr3t" not in ls.stdout + ls.stderr + warm.stdout + warm.stderr
        assert len([a for a in proxy.answers() if a.method == "GET"]) >= N_IMAGES


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_a_server_that_compresses_what_it_may(site: Path, tmp_path: Path, client: str) -> None:
    """nginx with ``gzip on`` for every type: objects are asked for as stored (identity),
    and the served manifest is read whatever the server does with it."""
    gzip = "gzip on; gzip_types *; gzip_min_length 0; gzip_proxied any;"
    with Nginx(site, server=gzip) as nginx:
        stats = _read_all(nginx.endpoint, tmp_path, http_client=client)
    assert stats.samples == N_IMAGES and not stats.skipped and not stats.retries


@pytest.mark.parametrize("code", [301, 302, 307, 308])
@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_images_a_server_redirects_elsewhere_are_followed(
    site: Path, jpeg_folder: Path, tmp_path: Path, code: int, client: str
) -> None:
    """A dataset's server that answers each image with a redirect to another server, a
    signed URL's query and all (a hub's ``resolve`` URLs sending their files to a CDN):
    every image is read where it was sent, once, by either client, each ranged part of a
    large one too; the hub answers each request with the redirect, nothing else."""
    images = _images(jpeg_folder)
    with Nginx(site) as cdn:
        redirect = f"location /train/ {{ return {code} {cdn.endpoint}$request_uri?sig=abc; }}"
        with Nginx(site, server=redirect) as hub:
            stats = _read_all(hub.endpoint, tmp_path / "cache", http_client=client)
            sent, got = hub.answers(), cdn.answers()
    assert stats.samples == N_IMAGES and not stats.skipped and not stats.retries
    assert {a.status for a in sent if a.path.startswith("/train/")} == {code}
    fetched = {a.path for a in got if a.method == "GET" and a.status in (200, 206)}
    assert fetched == set(images)


def test_a_redirect_that_never_ends_is_an_error_at_once(site: Path) -> None:
    """A server whose images redirect to themselves: a loader's first read (a HEAD for the
    image's size) and a GET of one on the lean client each stop after 10 requests along
    the redirects (aiohttp's limit) with an error that says so, not retried (no other try
    would end)."""
    loop = "location /train/ { return 302 $request_uri; }"
    with Nginx(site, server=loop) as nginx:
        with pytest.raises(al.StoreError, match="still redirected after 10 requests") as caught:
            with al.ImageLoader(
                f"{nginx.endpoint}/train/",
                batch_size=16,
                store=al.StoreConfig(options={"manifest": f"{nginx.endpoint}/train.jsonl"}),
                shuffle=False,
            ) as loader:
                next(iter(loader))
        assert not isinstance(caught.value, al.TransientStoreError)
        key = "class_00/img_000000.jpg"

        async def get() -> None:
            store = open_store(f"{nginx.endpoint}/train/")
            try:
                await store.get(key)
            finally:
                await store.close()

        with pytest.raises(al.StoreError, match="still redirected after 10 requests") as got:
            asyncio.run(get())
        assert not isinstance(got.value, al.TransientStoreError)
        answers = nginx.answers()
    heads = Counter(a.path for a in answers if a.method == "HEAD")
    # Each image asked along its redirects 10 times at most (the first to fail stopped
    # the others): none asked again.  The lean client's GETs are read from the log as soon
    # as its error comes: once, in a clean-clone CI run, the tenth was not written yet
    # (nginx writes a line after sending its answer); answers() now waits for it.
    said = f"{caught.value}; {got.value}; HEADs per image: {sorted(heads.items())}; all: "
    said += f"{Counter(answers)}"
    assert max(heads.values()) == 10, said
    gets = sum(1 for a in answers if a.method == "GET" and a.path == f"/train/{key}")
    assert gets == 10, said


@pytest.mark.parametrize("tls", [False, True])
def test_answers_hold_every_answer_a_client_has_had(site: Path, tls: bool) -> None:
    """The test equipment itself: read while nginx runs, right after each answer came,
    ``answers()`` holds it (nginx logs an answer after sending it: ``answers`` first
    waits for the line), and never its own settling request — over HTTPS too, and where
    the server refuses everything (``return 444``: the settling request is answered so,
    and logged, before a location could say not to)."""
    for server in ("", "return 444;"):
        with Nginx(site, server=server, tls=tls) as nginx:

            async def ask() -> None:
                store = open_store(f"{nginx.endpoint}/train/", ca_bundle=nginx.ca_file or None)
                try:
                    with contextlib.suppress(al.StoreError):
                        await store.get("class_00/img_000000.jpg")
                finally:
                    await store.close()

            for i in range(1, 21):
                asyncio.run(ask())
                answers = nginx.answers()
                assert [a.path for a in answers] == ["/train/class_00/img_000000.jpg"] * i


def test_credentials_in_a_web_url_are_sent_as_basic_and_never_shown(
    site: Path, tmp_path: Path
) -> None:
    """A server behind Basic credentials (nginx's ``auth_basic``), named with them in the
    URL as curl and requests take them: the loader's engine processes, ``ls`` and ``warm``
    read every image (the pages, the HEADs and the lean client's GETs all send them); the
    loader's URL, its ``repr``, the commands' output and a refusal's error never show the
    password, and the cache is keyed without it."""
    users = tmp_path / "users"
    users.write_text("trainer:{PLAIN}pa55-w0rd\n")
    guarded = f'autoindex on; auth_basic "data"; auth_basic_user_file {users};'
    with Nginx(site, server=guarded) as nginx:
        url = nginx.endpoint.replace("http://", "http://trainer:pa55-w0rd@") + "/train/"
        with al.ImageLoader(url, batch_size=16, cache_dir=tmp_path / "cache") as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES
            shown = f"{loader!r} {loader.url} {loader.stats()}"
        assert loader.url == f"{nginx.endpoint}/train/"
        for cmd in (["ls", url], ["warm", url, "--cache-dir", str(tmp_path / "c2")]):
            done = subprocess.run(
                [sys.executable, "-m", "asyncloader", *cmd],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            shown += done.stdout + done.stderr
        assert f"{N_IMAGES} objects warmed" in shown

        async def absolute() -> bytes:  # a manifest's key may be a URL with its own login
            store = open_store(f"{nginx.endpoint}/train/")
            try:
                return bytes(await store.get(url + "class_00/img_000000.jpg"))
            finally:
                await store.close()

        got = asyncio.run(absolute())
        assert got == (site / "train" / "class_00" / "img_000000.jpg").read_bytes()
        wrong = url.replace("pa55-w0rd", "not-pa55-w0rd")
        with pytest.raises(al.AccessDenied) as refused:
            with al.ImageLoader(wrong, batch_size=16) as loader:
                next(iter(loader))
        answers = nginx.answers()
    assert "pa55-w0rd" not in shown + str(refused.value)
    assert {a.status for a in answers if a.path.endswith(".jpg")} <= {200, 206, 401}
    assert sum(1 for a in answers if a.path.endswith(".jpg") and a.status == 200) >= N_IMAGES


def test_a_web_folder_over_https_with_a_private_ca(site: Path, tmp_path: Path) -> None:
    """A manifest and images over HTTPS from a server whose CA only ``ca_bundle=`` names:
    read with it; without it, a clear error that says what to pass, at once."""
    with Nginx(site, tls=True) as nginx:
        stats = _read_all(nginx.endpoint, tmp_path / "c1", ca_bundle=nginx.ca_file)
        assert stats.samples == N_IMAGES
        with pytest.raises(al.StoreError, match="ca_bundle="):
            al.listing(f"{nginx.endpoint}/train/", store_options={"manifest": "../train.jsonl"})


def test_sizes_by_a_ranged_get_where_head_is_refused(site: Path, tmp_path: Path) -> None:
    """A server that refuses HEAD (405): the manifest's objects are sized by a GET of their
    first byte (its Content-Range), and read."""
    no_head = "if ($request_method = HEAD) { return 405; }"
    with Nginx(site, server=no_head) as nginx:
        stats = _read_all(nginx.endpoint, tmp_path)
        answers = nginx.answers()
    assert stats.samples == N_IMAGES
    assert sum(a.method == "HEAD" and a.status == 405 for a in answers) == N_IMAGES
    assert sum(a.range == "bytes=0-0" and a.status == 206 for a in answers) == N_IMAGES


def test_a_strict_rate_limiter_is_paced_not_given_up_on(site: Path, tmp_path: Path) -> None:
    """nginx's limit_req at 150 requests/s without a burst (a request sooner than 1/150 s
    after the last is refused, 503): every image arrives, none given up after its
    retries, and the loader paces itself (most requests are answered)."""
    zone = "limit_req_zone $binary_remote_addr zone=one:1m rate=150r/s;"
    with Nginx(site, http=zone, server="limit_req zone=one nodelay;") as nginx:
        stats = _read_all(nginx.endpoint, tmp_path)
        answers = [a for a in nginx.answers() if a.path.endswith(".jpg")]
    assert stats.samples == N_IMAGES and not stats.skipped
    gets = [a for a in answers if a.method == "GET"]  # (the listing's HEADs are paced too)
    refused = sum(a.status == 503 for a in gets)
    assert stats.retries["throttled"] == refused and refused < len(gets) / 2


@pytest.mark.parametrize("listed", ["manifest", "metadata"])
def test_the_header_pass_is_paced_by_a_strict_rate_limiter_not_given_up_on(
    tmp_path: Path, listed: str
) -> None:
    """A bucketed run over 200 images behind nginx's limit_req at 300 requests/s without a
    burst: where a manifest gives their sizes, the header pass reads them straight away
    (64 at once), paced as the fetcher's reads are; where a metadata file names them
    without sizes, their sizing reads (a GET of each one's first 64 KiB, in rounds) go
    through the web store's budget.  Every image arrives, none given up after its
    retries."""
    import numpy as np
    from PIL import Image

    site = tmp_path / "site"
    (site / "img").mkdir(parents=True)
    rng = np.random.default_rng(5)
    rows = []
    for i in range(200):
        h, w = [(40, 40), (30, 60), (60, 30)][i % 3]
        path = site / "img" / f"{i:03d}.jpg"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        rows.append({"key": path.name, "size": path.stat().st_size, "file_name": path.name})
    options = {}
    if listed == "manifest":
        (site / "img.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        lines = [json.dumps({"file_name": r["file_name"]}) for r in rows]
        (site / "img" / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    zone = "limit_req_zone $binary_remote_addr zone=one:1m rate=300r/s;"
    with Nginx(site, http=zone, server="limit_req zone=one nodelay;") as nginx:
        if listed == "manifest":
            options = {"manifest": f"{nginx.endpoint}/img.jsonl"}
        with al.ImageLoader(
            f"{nginx.endpoint}/img/",
            batch_size=1,  # no bucket leaves a sample over
            labels=None,
            buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
            engine=al.EngineConfig(mode="inline"),
            store=al.StoreConfig(options=options),
            cache_dir=tmp_path / "cache",
        ) as loader:
            n = sum(len(x) for x, _ in loader)
            stats = loader.stats()
        refused = sum(a.status == 503 for a in nginx.answers() if a.path.endswith(".jpg"))
    assert n == 200 and not stats.skipped
    assert refused > 0  # it was throttled


def _captioned(endpoint: str, cache: Path, filters: Any = None) -> tuple[list[str], al.Stats]:
    """A bucketed epoch of the caption folder at ``endpoint`` with its captions: the
    captions, and the loader's stats."""
    with al.ImageLoader(
        f"{endpoint}/",
        batch_size=2,
        labels=None,
        buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
        filters=filters,
        extras=("text", "original_size"),
        engine=al.EngineConfig(mode="inline"),
        cache_dir=cache,
    ) as loader:
        texts = [t for _, _, e in loader for t in e["text"]]
        return texts, loader.stats()


def test_a_caption_folder_on_nginx_runs_from_the_node_s_cache_with_nginx_stopped(
    tmp_path: Path,
) -> None:
    """No manifest: the folder's metadata.jsonl names its images. ``warm`` fills the
    node's cache (the listing, the metadata file by its ETag, the images); then, nginx
    stopped, a bucketed run with captions starts and finishes from the node's disk."""
    folder = caption_folder(tmp_path / "site")
    cache = tmp_path / "cache"
    with Nginx(folder) as nginx:
        endpoint = nginx.endpoint
        report = al.warm(f"{endpoint}/", str(cache))
        assert report.listed == report.warmed == 12 and not report.failed
        first, _ = _captioned(endpoint, cache)
    again, stats = _captioned(endpoint, cache)  # nginx stopped: nothing answers there
    assert sorted(again) == sorted(first) and len(first) == 12  # 4 buckets' worth of 3
    assert stats.requests == 0


def test_a_filtered_caption_folder_on_nginx_never_asks_for_what_the_filter_leaves_out(
    tmp_path: Path,
) -> None:
    """No manifest, no ``warm``: a bucketed, filtered run asks nginx for the metadata file
    and for the images the filter keeps (one range read each, of its first 64 KiB: its
    size and its header, and here the whole image, which the cache keeps for the epoch);
    the access log holds no line for an image it leaves out.  Then, nginx stopped, the same run starts
    and finishes from the node's disk: the listing kept there, its unasked sizes unknown."""
    folder = caption_folder(tmp_path / "site")
    cache = tmp_path / "cache"
    filters = [[("score", "==", 2)], [("text", "in", ["photo 0", "photo 3"])]]
    with Nginx(folder) as nginx:
        first, stats = _captioned(nginx.endpoint, cache, filters)
        answers = nginx.answers()
    kept = {2, 5, 8, 11, 0, 3}
    assert sorted(first) == sorted(f"photo {i}" for i in kept)
    assert stats.filtered_out == 6
    for i in range(12):
        name = f"/sub/{i:02d}.jpg" if i % 4 == 0 else f"/{i:02d}.jpg"
        lines = [a for a in answers if a.path == name]
        assert bool(lines) == (i in kept), (name, answers)
        if i in kept:
            assert [(a.method, a.range) for a in lines] == [("GET", "bytes=0-65535")], lines
    again, stats = _captioned(nginx.endpoint, cache, filters)  # nginx stopped
    assert sorted(again) == sorted(first) and stats.requests == 0


@pytest.mark.parametrize("server", ["", IGNORE_RANGES], ids=["ranges", "max_ranges-0"])
def test_a_bucketed_caption_folder_of_large_images_is_sized_by_each_image_s_header_read(
    tmp_path: Path, server: str
) -> None:
    """Images over 64 KiB named by a ``metadata.jsonl`` without sizes, in aspect-ratio
    buckets: each image's size, ETag and header come from one range read of its first
    64 KiB (no HEAD), and the epoch reads it once more, whole; where nginx ignores ranges,
    that one read brings it whole, the cache keeps it, and the epoch reads it there: one
    GET an image.  Each sample's ``original_size`` is its image's; a row naming a file
    nginx does not have is a counted skip; the next run on the node asks nothing: the
    saved listing says that file is not there (until the listing is refreshed)."""
    import numpy as np
    from PIL import Image

    site = tmp_path / "site"
    site.mkdir()
    rng = np.random.default_rng(3)
    shapes = {}
    for i, (h, w) in enumerate([(300, 300), (220, 440), (440, 220)] * 2):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(site / f"{i}.jpg", quality=95)
        assert (site / f"{i}.jpg").stat().st_size > 64 * 1024
        shapes[f"{i}.jpg"] = (h, w)
    rows = [{"file_name": n, "text": n} for n in [*shapes, "gone.jpg"]]
    (site / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run(endpoint: str) -> tuple[dict[str, tuple[int, int]], al.Stats]:
        with al.ImageLoader(
            f"{endpoint}/",
            batch_size=1,  # no bucket leaves a sample over
            labels=None,
            buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
            extras=("text", "original_size"),
            errors=al.ErrorConfig(on_error="skip", max_failures=2),
            engine=al.EngineConfig(mode="inline"),
            cache_dir=tmp_path / "cache",
        ) as loader:
            got = {
                t: (int(hw[0]), int(hw[1]))
                for _, _, e in loader  # type: ignore[misc]
                for t, hw in zip(e["text"], e["original_size"], strict=True)
            }
            return got, loader.stats()

    with Nginx(site, server=server) as nginx:
        got, stats = run(nginx.endpoint)
        answers = nginx.answers()
        assert got == shapes and stats.skipped == {"ObjectNotFound": 1}
        for name in shapes:
            lines = [(a.method, a.status) for a in answers if a.path == f"/{name}"]
            if server == IGNORE_RANGES:
                assert lines == [("GET", 200)], (name, lines)
            else:
                assert len(lines) == 2 and lines[0] == ("GET", 206), (name, lines)
                assert all(method == "GET" for method, _ in lines), (name, lines)
        again, stats = run(nginx.endpoint)
        later = nginx.answers()[len(answers) :]
    # The images come from the node's disk; the missing one is missing by the saved
    # listing, not asked again, and skipped again.
    assert again == got and stats.skipped == {"ObjectNotFound": 1}
    assert later == [], later


def test_images_sized_by_their_first_bytes_are_kept_only_where_the_cache_has_room(
    tmp_path: Path,
) -> None:
    """The sizing reads of a bucketed run bring these small images whole; they are kept
    for the epoch where the images would fill at most half the cache (a loader's own
    admission then keeps them all too): with a cache of about their size, none is kept by
    the sizing pass, and the epoch asks for each again."""
    folder = caption_folder(tmp_path / "site")
    total = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    with Nginx(folder) as nginx:
        with al.ImageLoader(
            f"{nginx.endpoint}/",
            batch_size=1,
            labels=None,
            buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
            engine=al.EngineConfig(mode="inline"),
            cache_dir=tmp_path / "cache",
            cache=al.CacheConfig(size=int(1.5 * total)),
        ) as loader:
            n = sum(len(x) for x, _ in loader)
        answers = [a for a in nginx.answers() if a.path.endswith(".jpg")]
    assert n == 12
    per_image = Counter(a.path for a in answers)
    # Each asked by its sizing read, then by the epoch (the next epoch's first batches,
    # prefetched before the loader closed, may ask one again).
    assert len(per_image) == 12 and min(per_image.values()) >= 2, per_image
    assert all(a.method == "GET" for a in answers)


def test_an_empty_file_in_a_bucketed_caption_folder_is_named_as_one(tmp_path: Path) -> None:
    """A 0-byte file the metadata names: the header pass asks no range of nothing (nginx
    answers 416 to one) and names it as empty; under ``on_error="skip"`` it is a counted
    skip and the rest stream."""
    folder = caption_folder(tmp_path / "site")
    (folder / "empty.jpg").write_bytes(b"")
    rows = (folder / "metadata.jsonl").read_text()
    row = {"file_name": "empty.jpg", "text": "empty", "score": 1}
    (folder / "metadata.jsonl").write_text(rows + json.dumps(row) + "\n")
    kw: dict[str, Any] = dict(
        batch_size=1,
        labels=None,
        buckets=al.Buckets(((32, 32), (24, 48), (48, 24))),
        engine=al.EngineConfig(mode="inline"),
    )
    with Nginx(folder) as nginx:
        with pytest.raises(al.DecodeError, match=r"empty\.jpg: an empty object \(0 bytes\)"):
            with al.ImageLoader(f"{nginx.endpoint}/", cache_dir=tmp_path / "c1", **kw) as loader:
                next(iter(loader))
        skip = al.ErrorConfig(on_error="skip", max_failures=1)
        with al.ImageLoader(
            f"{nginx.endpoint}/", cache_dir=tmp_path / "c2", errors=skip, **kw
        ) as loader:
            n = sum(len(x) for x, _ in loader)
            assert n == 12 and loader.stats().skipped == {"DecodeError": 1}


@pytest.mark.parametrize("listing", ["html", "html-rounded", "json"])
def test_a_class_folder_on_nginx_s_autoindex_streams_without_a_manifest(
    jpeg_folder: Path, tmp_path: Path, listing: str
) -> None:
    """No manifest and no metadata file: nginx's ``autoindex`` pages list the class folders,
    their images and the captions beside them.  A filter on ``size`` keeps the smaller half:
    nginx's JSON pages and its HTML pages give every size (no HEAD at all); HTML pages with
    rounded sizes (``autoindex_exact_size off``) only those below 10,000 bytes (a HEAD for
    each other image, then the filter).  An image the filter leaves out is never fetched,
    and, where its page gave its size, never asked at all.  Nginx stopped, the same run
    comes from the node."""
    site = tmp_path / "site"
    sizes, cut, kept = class_cut(site, jpeg_folder)
    assert any(size <= 9999 for size in sizes.values()) and max(sizes.values()) > 9999
    server = (
        "autoindex on;"
        + {
            "html": "",
            "html-rounded": " autoindex_exact_size off;",
            "json": " autoindex_format json;",
        }[listing]
    )
    cache = tmp_path / "cache"
    with Nginx(site, server=server) as nginx:
        got, classes, stats = class_epoch(f"{nginx.endpoint}/", cut, cache)
        answers = nginx.answers()
    assert classes == ("cat", "dog")
    want = class_captions(kept)
    assert got == want and stats.filtered_out == len(sizes) - len(kept)
    for key in sizes:
        asked = {a.method for a in answers if a.path == f"/{key}"}
        heads = {"HEAD"} if listing == "html-rounded" and sizes[key] > 9999 else set()
        assert asked == (heads | {"GET"} if key in kept else heads), (key, asked)
    again, _, stats = class_epoch(f"{nginx.endpoint}/", cut, cache)  # nginx stopped
    assert again == want and stats.requests == 0


def test_a_folder_whose_page_is_refused_is_named_not_listed(
    jpeg_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder the pages link but nginx refuses (``deny all``: 403): its files cannot be
    listed, and a warning names it; the other folders' files are listed."""
    site = tmp_path / "site"
    class_site(site, jpeg_folder)
    (site / "private").mkdir()
    (site / "private" / "0.jpg").write_bytes(b"never listed")
    with (
        Nginx(site, server="autoindex on; location /private/ { deny all; }") as nginx,
        caplog.at_level("WARNING", logger="asyncloader"),
    ):
        keys = listed_keys(f"{nginx.endpoint}/")
    assert keys and all(k.startswith(("cat/", "dog/")) for k in keys)
    assert "1 folders its pages link gave no page (403 or 404)" in caplog.text
    assert "private/" in caplog.text
