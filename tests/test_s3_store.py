"""The S3 store and the fetcher against moto_server (a real HTTP server on 127.0.0.1).

Listing, ranges, missing objects and throttling are in the conformance suite
(tests/test_conformance.py); these are the S3- and fetcher-specific cases."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader import FetchConfig, IntegrityError, ObjectNotFound, S3Store, StoreError
from asyncloader._base._errors import WrongRegion
from asyncloader._base._stats import Counters
from asyncloader._fetch import Fetcher
from asyncloader.testing import MotoServer, S3TestServer

from .conftest import N_IMAGES


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_multi_megabyte_object_reassembled_byte_exact(moto: MotoServer) -> None:
    moto.create_bucket("big")
    blob = os.urandom(5 * 1024 * 1024 + 12345)
    moto.put("big", "blob.bin", blob)

    async def main() -> tuple[bytes, Counters]:
        store = S3Store("big", endpoint_url=moto.endpoint)
        counters = Counters()
        fetcher = Fetcher(store, counters, FetchConfig(range_threshold=1 << 20, part_size=1 << 20))
        try:
            info = await store.stat("blob.bin")
            return await fetcher.fetch(info), counters
        finally:
            await store.close()

    data, counters = run(main())
    assert data == blob
    assert counters.requests == 6  # five full 1 MiB parts and the tail, in parallel
    assert counters.bytes_fetched == len(blob)


def test_object_replaced_after_listing_is_refused(moto: MotoServer) -> None:
    moto.create_bucket("swap")
    moto.put("swap", "a.bin", b"old contents")

    async def main() -> None:
        store = S3Store("swap", endpoint_url=moto.endpoint)
        fetcher = Fetcher(store, Counters(), FetchConfig())
        try:
            listed = [o async for o in store.list()]
            await asyncio.to_thread(moto.put, "swap", "a.bin", b"new contents!!")
            with pytest.raises(IntegrityError, match=r"a\.bin"):
                await fetcher.fetch(listed[0])
        finally:
            await store.close()

    run(main())


def test_missing_bucket_is_a_clear_error(moto: MotoServer) -> None:
    async def main() -> None:
        store = S3Store("no-such-bucket", endpoint_url=moto.endpoint)
        try:
            with pytest.raises(ObjectNotFound, match="no-such-bucket"):
                [o async for o in store.list()]
        finally:
            await store.close()

    run(main())


# --- a bucket in another region ------------------------------------------------------------


@pytest.mark.parametrize("http_client", ["lean", "aiohttp"])
@pytest.mark.parametrize("answer", ["redirect", "malformed"])
def test_a_bucket_in_another_region_is_found_from_s3s_answer(
    light_server: S3TestServer, answer: str, http_client: str
) -> None:
    # The environment says us-east-1 (as an unset region does); the bucket is elsewhere.
    # Whatever the first request is, its answer names the region, the store signs for
    # it from then on, and only that first request is refused.
    light_server.set_region("b", "eu-west-1", answer=answer)
    opts = {"endpoint_url": light_server.endpoint, "http_client": http_client}

    key = sorted(light_server.stats()["keys"])[0][len("train/") :]

    async def first(what: str) -> object:
        store = S3Store("b", "train/", **opts)  # type: ignore[arg-type]
        try:
            if what == "list":
                return len([o async for o in store.list()])
            if what == "stat":
                return (await store.stat(key)).size > 0
            if what == "put":
                return (await store.put("new/x.bin", b"abc")).size
            return len(await store.get(key))
        finally:
            await store.close()

    for what in ("list", "stat", "get", "put"):
        before = light_server.stats()["counters"].get("wrong_region", 0)
        assert run(first(what))
        assert light_server.stats()["counters"]["wrong_region"] == before + 1, what


def test_a_loader_reads_a_bucket_in_another_region(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    # A saved listing: the first requests are dozens of GETs at once, all refused; the
    # store moves once, and every sample arrives.
    light_server.set_region("b", "ap-southeast-2")
    opts = {"endpoint_url": light_server.endpoint}
    kw = {
        "batch_size": 16,
        "decode": al.DecodeConfig(workers=2),
        "store": al.StoreConfig(options=opts),
        "cache_dir": tmp_path,
    }
    with al.ImageLoader("s3://b/train/", **kw) as loader:  # type: ignore[arg-type]
        assert loader.classes  # listed and saved beside the cache
    light_server.reset_stats()
    with al.ImageLoader("s3://b/train/", **kw, shuffle=False) as loader:  # type: ignore[arg-type]
        n = sum(len(images) for images, _ in loader)
        stats = loader.stats()
    counters = light_server.stats()["counters"]
    assert n == N_IMAGES and stats.skipped == {} and counters.get("list", 0) == 0
    assert 1 <= counters["wrong_region"] <= stats.max_inflight


def test_an_answer_that_names_no_region_is_a_clear_error() -> None:
    from asyncloader._stores._http import error_for_status

    body = b"<Error><Code>PermanentRedirect</Code><Message>use the endpoint</Message></Error>"
    exc = error_for_status(301, body, what="s3://b/k", key="k")
    assert isinstance(exc, WrongRegion) and exc.region == ""
    assert "pass the bucket's region (the store option region=..." in str(exc)
    assert "StoreConfig(options={'region': ...})) or set AWS_REGION" in str(exc)
    head = error_for_status(400, b"", what="s3://b/k", key="k", region="eu-west-1")  # a HEAD
    assert isinstance(head, WrongRegion) and head.region == "eu-west-1"
    # A 400 that is not about the region stays what it was.
    other = error_for_status(400, b"<Error><Code>InvalidArgument</Code></Error>", what="x", key="k")
    assert not isinstance(other, WrongRegion) and isinstance(other, StoreError)
    # Errors travel between processes with their region.
    assert pickle.loads(pickle.dumps(head)).region == "eu-west-1"


@pytest.mark.parametrize(
    ("host", "old", "new", "moved"),
    [
        ("b.s3.us-east-1.amazonaws.com", "us-east-1", "eu-west-1", "b.s3.eu-west-1.amazonaws.com"),
        ("s3.amazonaws.com", "us-east-1", "eu-west-1", "s3.eu-west-1.amazonaws.com"),
        (
            "s3.dualstack.us-west-2.amazonaws.com",
            "us-west-2",
            "eu-north-1",
            "s3.dualstack.eu-north-1.amazonaws.com",
        ),
        (
            "b.s3-fips.us-east-1.amazonaws.com",
            "us-east-1",
            "us-west-2",
            "b.s3-fips.us-west-2.amazonaws.com",
        ),
        (
            "b.s3.cn-north-1.amazonaws.com.cn",
            "cn-north-1",
            "cn-northwest-1",
            "b.s3.cn-northwest-1.amazonaws.com.cn",
        ),
        ("minio.local:9000", "us-east-1", "eu-west-1", "minio.local:9000"),
        ("127.0.0.1:8000", "us-east-1", "eu-west-1", "127.0.0.1:8000"),
    ],
)
def test_only_aws_hosts_move_with_the_region(host: str, old: str, new: str, moved: str) -> None:
    from asyncloader._stores._s3_hosts import aws_host_in as _aws_host_in

    assert _aws_host_in(host, old, new) == moved


def test_on_aws_the_store_moves_to_the_buckets_regional_endpoint() -> None:
    # No endpoint given: AWS itself, virtual-hosted.  Nothing is sent; the move is local.
    async def moved() -> tuple[str, str, str, int]:
        store = S3Store("b", "train/")
        try:
            await store._ensure()
            assert store._host == "b.s3.us-east-1.amazonaws.com"
            store._move(WrongRegion("elsewhere", region="eu-west-1"))
            store._move(WrongRegion("elsewhere", region="eu-west-1"))  # a second: no-op
            assert store._signer is not None
            return store._host, store._base, store._signer.region, len(store._retired)
        finally:
            await store.close()

    host, base, region, retired = run(moved())
    assert (host, region, retired) == ("b.s3.eu-west-1.amazonaws.com", "eu-west-1", 1)
    assert base == "https://b.s3.eu-west-1.amazonaws.com"


def test_a_requester_pays_bucket_is_read_with_requester_pays(light_server: S3TestServer) -> None:
    light_server.set_requester_pays("b")
    opts = {"endpoint_url": light_server.endpoint}

    async def without() -> None:
        store = S3Store("b", "train/", **opts)  # type: ignore[arg-type]
        try:
            await store.stat("x.jpg")
        finally:
            await store.close()

    with pytest.raises(al.AccessDenied):  # without: refused, as S3 refuses it
        run(without())
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=32,
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={**opts, "requester_pays": True}),
    ) as loader:
        n = sum(len(images) for images, _ in loader)
    assert n == N_IMAGES
    assert light_server.stats()["counters"]["payer_refused"] == 1  # only the one without
    with pytest.raises(ValueError, match="needs credentials"):
        S3Store("b", anonymous=True, requester_pays=True)


@pytest.mark.parametrize(
    ("env", "bucket", "base"),
    [
        ({}, "b", "https://b.s3.us-east-1.amazonaws.com"),
        ({}, "my.data", "https://s3.us-east-1.amazonaws.com/my.data"),
        ({"AWS_USE_FIPS_ENDPOINT": "true"}, "b", "https://b.s3-fips.us-east-1.amazonaws.com"),
        (
            {"AWS_USE_FIPS_ENDPOINT": "true"},
            "my.data",
            "https://s3-fips.us-east-1.amazonaws.com/my.data",
        ),
        (
            {"AWS_USE_DUALSTACK_ENDPOINT": "true"},
            "b",
            "https://b.s3.dualstack.us-east-1.amazonaws.com",
        ),
        (
            {"AWS_USE_FIPS_ENDPOINT": "true", "AWS_USE_DUALSTACK_ENDPOINT": "true"},
            "b",
            "https://b.s3-fips.dualstack.us-east-1.amazonaws.com",
        ),
        ({"AWS_USE_FIPS_ENDPOINT": "false"}, "b", "https://b.s3.us-east-1.amazonaws.com"),
        ({"AWS_DEFAULT_REGION": "cn-north-1"}, "b", "https://b.s3.cn-north-1.amazonaws.com.cn"),
        ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}, "b", "http://127.0.0.1:9000/b"),
    ],
)
def test_aws_endpoints_as_the_aws_tools_resolve_them(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], bucket: str, base: str
) -> None:
    # FIPS and dual-stack settings are kept (a FIPS-bound account must never reach a plain
    # endpoint), as botocore's own resolution gives them.  Nothing is sent.
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert run(_resolved(bucket)) == base


@pytest.mark.parametrize(
    ("style", "endpoint", "bucket", "base"),
    [
        ("virtual", "http://minio.test:9000", "b", "http://b.minio.test:9000"),
        ("virtual", "http://gw.test/s3/", "b", "http://b.gw.test/s3"),
        ("path", None, "b", "https://s3.us-east-1.amazonaws.com/b"),
        ("auto", "http://127.0.0.1:9000/s3", "b", "http://127.0.0.1:9000/s3/b"),
        (None, "http://127.0.0.1:9000/a/b/", "bk", "http://127.0.0.1:9000/a/b/bk"),
    ],
)
def test_the_addressing_style_and_an_endpoint_s_path_as_boto3_reads_them(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    style: str | None,
    endpoint: str | None,
    bucket: str,
    base: str,
) -> None:
    """The AWS config's ``s3 = addressing_style = ...`` of the profile, on AWS and on a
    custom endpoint; a custom endpoint's path kept before the bucket.  Nothing is sent."""
    config = tmp_path / "config"
    config.write_text(f"[default]\ns3 =\n    addressing_style = {style}\n" if style else "")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))

    assert run(_resolved(bucket, endpoint)) == base


async def _resolved(bucket: str, endpoint: str | None = None) -> str:
    """Where the store of ``bucket`` sends its requests (base URL and path), as resolved
    from the environment and the AWS config; nothing is sent."""
    store = S3Store(bucket, "train/", endpoint_url=endpoint)
    try:
        await store._ensure()
        return store._base + store._base_path
    finally:
        await store.close()


def test_moto_checking_every_signature_serves_the_loader(
    jpeg_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto checking each request as AWS does (the key known to its IAM, the SigV4
    signature recomputed from the request, the user's policy) serves the loader's GETs,
    ranged parts, HEADs and a manifest's PUT signed by the lean client and by aiohttp; the
    same key with a wrong secret is refused as a credentials error.

    moto recomputes a signature from the path and query as it decoded them, so it refuses
    botocore's own requests for keys with reserved characters and listings with a ``/`` in
    the query (``delimiter``, ``prefix``): keys here keep to letters, digits and spaces, and
    the loader reads from a manifest.  Listing and such keys are signed by the same code,
    checked against botocore's signer (tests/test_sigv4.py)."""
    files = sorted(jpeg_folder.rglob("*.jpg"))[:6]
    keys = [f"img {i}.jpg" for i in range(len(files))]
    with MotoServer(check_credentials=True) as checking:
        checking.create_bucket("signed")
        for key, path in zip(keys, files, strict=True):
            checking.put("signed", key, path.read_bytes())
        for name, value in checking.credentials().items():
            monkeypatch.setenv(name, value)
        rows = []  # with sizes and ETags a manifest is the listing (ETags as boto3's, quoted)
        for i, key in enumerate(keys):
            head = checking.client().head_object(Bucket="signed", Key=key)
            rows.append(
                {"key": key, "label": i, "size": head["ContentLength"], "etag": head["ETag"]}
            )
        manifest = tmp_path / "m.jsonl"
        manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
        for client in ("lean", "aiohttp"):
            loader = al.ImageLoader(
                "s3://signed/",
                labels=str(manifest),
                batch_size=3,
                transform=al.Resize(32),
                fetch=FetchConfig(range_threshold=32 << 10, part_size=16 << 10),
                engine=al.EngineConfig(mode="inline"),
                store=al.StoreConfig(
                    options={"endpoint_url": checking.endpoint, "http_client": client}
                ),
            )
            with loader:
                labels = sorted(int(x) for _, batch in loader for x in batch)
                stats = loader.stats()
            assert labels == list(range(len(keys)))
            assert stats.requests > len(keys)  # parts: each ~100 KB photo in 16 KiB ranges

        async def main() -> None:
            store = S3Store("signed", endpoint_url=checking.endpoint)
            try:
                info = await store.put("out/manifest.json", b'{"n": 6}')
                assert (await store.stat("out/manifest.json")).size == info.size == 8
                assert bytes(await store.get("img 0.jpg", start=0, end=2)) == b"\xff\xd8"
            finally:
                await store.close()
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-of-this-key")
            store = S3Store("signed", endpoint_url=checking.endpoint)
            try:
                with pytest.raises(al.AccessDenied, match="credentials") as caught:
                    await store.get("img 0.jpg")
                assert "not-the-secret" not in str(caught.value)
            finally:
                await store.close()

        run(main())
