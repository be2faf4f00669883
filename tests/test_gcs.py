"""Google Cloud Storage specifics on fake-gcs-server: URLs, the emulator variable, bearer
tokens from google-auth (a service-account key exchanged at a local token endpoint), token
refresh, the cache, ``warm`` and ``ls`` by URL.  The whole loader runs on GCS in
test_loader.py and the store contract in test_conformance.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader._stores._bearer import BearerToken
from asyncloader.testing import FaultProxy, GCSEmulator, TokenServer

from .conftest import N_CLASSES, N_IMAGES


@pytest.fixture(scope="module")
def gcs_data(gcs_emulator: GCSEmulator, jpeg_folder: Path) -> GCSEmulator:
    gcs_emulator.create_bucket("imgs")
    gcs_emulator.upload_folder("imgs", jpeg_folder, "train/")
    return gcs_emulator


async def _count(store: al.ObjectStore) -> int:
    try:
        n = 0
        async for _ in store.list():
            n += 1
        return n
    finally:
        await store.close()


def test_urls() -> None:
    store = al.open_store("gs://bkt/some/prefix", anonymous=True)
    assert isinstance(store, al.GCSStore)
    assert (store.bucket, store.prefix, store.url) == (
        "bkt",
        "some/prefix/",
        "gs://bkt/some/prefix/",
    )
    assert store.endpoint == "https://storage.googleapis.com"
    assert isinstance(al.open_store("gcs://bkt/", anonymous=True), al.GCSStore)
    with pytest.raises(ValueError, match="needs a bucket"):
        al.open_store("gs:///x")


def test_the_emulator_variable_means_anonymous(
    gcs_data: GCSEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = gcs_data.endpoint.removeprefix("http://")  # the form the Google tools write
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    store = al.GCSStore("imgs", "train/")
    assert store.anonymous and store.endpoint == gcs_data.endpoint
    with al.ImageLoader(
        "gs://imgs/train/",
        batch_size=32,
        decode=al.DecodeConfig(workers=2),
    ) as loader:
        assert loader.classes == tuple(f"class_{i:02d}" for i in range(N_CLASSES))
        assert sum(len(labels) for _, labels in loader) == N_IMAGES


def test_no_credentials_is_a_clear_error(gcs_data: GCSEmulator) -> None:
    # conftest leaves no key file, no gcloud login and no metadata server to find.
    store = al.GCSStore("imgs", "train/", endpoint_url=gcs_data.endpoint)
    with pytest.raises(al.AccessDenied, match="no Google Cloud credentials"):
        asyncio.run(_count(store))


def test_service_account_tokens_reach_the_service(gcs_data: GCSEmulator, tmp_path: Path) -> None:
    """google-auth signs an assertion with the key file and exchanges it at the token
    endpoint; every request carries that one token; a token the service stops accepting
    (401) is replaced and the request sent again."""
    with TokenServer() as tokens, FaultProxy(gcs_data.endpoint) as proxy:
        key_file = tokens.google_service_account(tmp_path / "sa.json")
        store = al.GCSStore(
            "imgs", "train/", endpoint_url=proxy.endpoint, credentials_file=str(key_file)
        )
        first_token, second_token = (f"Bearer {tokens.google_token(n)}" for n in (1, 2))

        async def run() -> tuple[int, bytes, bytes]:
            try:
                objects = [o async for o in store.list()]
                first = await store.get(objects[0].key, etag=objects[0].etag)
                proxy.revoke(first_token)
                again = await store.get(objects[1].key, etag=objects[1].etag)
                return len(objects), first, again
            finally:
                await store.close()

        n, first, again = asyncio.run(run())
        assert n == N_IMAGES and first[:2] == again[:2] == b"\xff\xd8"
        assert tokens.issued == 2
        assert set(proxy.authorizations) == {first_token, second_token}
        assert proxy.authorizations[second_token] == 1  # the GET sent again


def test_a_token_is_refreshed_before_it_expires() -> None:
    """Inside the refresh margin the current token is used while a new one is fetched
    behind it; a token about to expire (or none) makes requests wait, all for one fetch."""
    now = [1000.0]
    fetched: list[str] = []

    def source() -> tuple[str, float]:
        fetched.append(f"t{len(fetched) + 1}")
        return fetched[-1], now[0] + 3600

    async def run() -> None:
        token = BearerToken(source, what="test", clock=lambda: now[0])
        assert await asyncio.gather(*(token.header() for _ in range(5))) == ["Bearer t1"] * 5
        assert fetched == ["t1"]
        assert token.refreshes_at == pytest.approx(1000 + 3600 - 300)
        now[0] += 3600 - 200  # inside the margin: the old token, a refresh behind it
        assert await token.header() == "Bearer t1"
        await asyncio.sleep(0.05)
        assert fetched == ["t1", "t2"] and await token.header() == "Bearer t2"
        now[0] += 3600  # t2 expired: wait for t3
        assert await token.header() == "Bearer t3"
        token.invalidate()
        assert await token.header() == "Bearer t4"
        await token.close()

    asyncio.run(run())


def test_a_failing_token_source_is_access_denied() -> None:
    def source() -> tuple[str, float]:
        raise OSError("metadata server unreachable")

    async def run() -> None:
        token = BearerToken(source, what="the metadata server")
        with pytest.raises(al.AccessDenied, match="the metadata server"):
            await token.header()

    asyncio.run(run())


def test_cache_warm_and_ls_by_url(gcs_data: GCSEmulator, tmp_path: Path) -> None:
    """``warm`` and ``ls`` on a gs:// URL (emulator from the environment), then a loader
    on the warmed cache sends no GET: requests are counted at a proxy."""
    cache = tmp_path / "c"
    with FaultProxy(gcs_data.endpoint) as proxy:
        env = {**os.environ, "STORAGE_EMULATOR_HOST": proxy.endpoint}
        base = [sys.executable, "-m", "asyncloader"]
        warm = subprocess.run(
            [*base, "warm", "gs://imgs/train/", "--all-objects", "--cache-dir", str(cache)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert warm.returncode == 0, warm.stderr
        assert str(N_IMAGES) in warm.stdout + warm.stderr
        ls = subprocess.run(
            [*base, "ls", "gs://imgs/train/", "--json", "--cache-dir", str(cache)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ls.returncode == 0, ls.stderr
        inv = json.loads(ls.stdout)
        assert inv["samples"] == N_IMAGES and len(inv["classes"]) == N_CLASSES
        before = proxy.requests
        opts = {"endpoint_url": proxy.endpoint, "anonymous": True}
        with al.ImageLoader(
            "gs://imgs/train/",
            batch_size=32,
            cache_dir=cache,
            store=al.StoreConfig(options=opts),
        ) as loader:
            assert sum(len(lab) for _, lab in loader) == N_IMAGES
            stats = loader.stats()  # (the next epoch is prefetched already: more hits)
            assert stats.requests == 0 and stats.cache_hits >= N_IMAGES
        assert proxy.requests == before  # the saved listing and the cached objects


def test_a_flat_run_of_names_is_listed_by_ranges_side_by_side(gcs_emulator: GCSEmulator) -> None:
    """600 numbered names at 50 a page: after the first page the rest of the name space is
    cut into ranges listed from their ``startOffset`` side by side (one of them throttled
    once, and asked again); every name comes out once, in order."""
    from concurrent.futures import ThreadPoolExecutor

    gcs_emulator.create_bucket("flat")
    names = [f"run/img_{i:05d}.jpg" for i in range(600)]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda n: gcs_emulator.put("flat", n, n.encode()), names))
    with FaultProxy(gcs_emulator.endpoint) as proxy:
        proxy.fail_next(1, status=503, code="SlowDown", path_contains="startOffset")
        objects = al.listing(
            "gs://flat/run/",
            store_options={"endpoint_url": proxy.endpoint, "anonymous": True, "page_size": 50},
        )
        assert proxy.injected == 1  # a range was listed from its start
        assert proxy.requests <= 12 + 45 + 1  # its pages, the ranges' overlaps, the retry
    assert [o.key for o in objects] == [n[len("run/") :] for n in names]
    assert [o.size for o in objects] == [len(n) for n in names]


READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"
READ_WRITE = "https://www.googleapis.com/auth/devstorage.read_write"


def test_reads_ask_for_a_read_only_token_and_writes_for_one_that_may_write(
    gcs_data: GCSEmulator, tmp_path: Path
) -> None:
    """google-auth asks the token endpoint for the read-only scope for listing and reading,
    and for the read-write scope only when the store writes (``put``: manifests); a write
    the service refuses (403: a token or role that may only read) names that scope."""
    with TokenServer() as tokens, FaultProxy(gcs_data.endpoint) as proxy:
        key_file = tokens.google_service_account(tmp_path / "sa.json")
        store = al.GCSStore(
            "imgs", "scoped/", endpoint_url=proxy.endpoint, credentials_file=str(key_file)
        )

        async def run() -> tuple[int, al.ObjectInfo]:
            try:
                listed = len([o async for o in store.list()])
                written = await store.put("train.jsonl", b'{"key": "a.jpg"}\n')
                return listed, written
            finally:
                await store.close()

        listed, written = asyncio.run(run())
        assert listed == 0 and written.size == 17
        reader, writer = (f"Bearer {tokens.google_token(n)}" for n in (1, 2))
        assert tokens.scopes == {
            tokens.google_token(1): READ_ONLY,
            tokens.google_token(2): READ_WRITE,
        }
        assert set(proxy.authorizations) == {reader, writer}
        assert proxy.authorizations[writer] == 1  # the upload, and nothing else

        proxy.read_only(f"Bearer {tokens.google_token(3)}")  # the next write token's
        store = al.GCSStore(
            "imgs", "scoped/", endpoint_url=proxy.endpoint, credentials_file=str(key_file)
        )

        async def refused() -> None:
            try:
                await store.put("again.jsonl", b"{}\n")
            finally:
                await store.close()

        with pytest.raises(al.AccessDenied) as denied:
            asyncio.run(refused())
        assert tokens.scopes[tokens.google_token(3)] == READ_WRITE
        assert any(READ_WRITE in note for note in denied.value.__notes__)
