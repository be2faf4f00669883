"""One conformance suite (``asyncloader.testing.check_object_store``) for every store, each on
a real server: S3 on moto_server, Azure on Azurite, Google Cloud Storage on fake-gcs-server,
plain HTTP on our light server, and a local folder.  Throttling goes through a fault-injecting proxy in front of the server."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from asyncloader import AzureStore, GCSStore, HttpStore, LocalStore, ObjectStore, S3Store
from asyncloader.testing import (
    Azurite,
    FaultProxy,
    FaultyStore,
    GCSEmulator,
    MemoryBucket,
    MemoryStore,
    MotoServer,
    S3TestServer,
    StoreFixture,
    TokenServer,
    check_object_store,
)


def _threaded(put: Callable[[str, bytes], None]) -> Callable[[Mapping[str, bytes]], None]:
    def put_many(items: Mapping[str, bytes]) -> None:
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda kv: put(*kv), items.items()))

    return put_many


def _failer(proxy: FaultProxy, status: int, code: str) -> Callable[[int, str], None]:
    return lambda n, key: proxy.fail_next(n, status=status, code=code, path_contains=key)


def test_s3_on_moto(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    moto.create_bucket("conform")

    def wrong() -> tuple[ObjectStore, str]:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-1234")
        return S3Store("conform", "root/", endpoint_url=checking.endpoint), "wrong-secret-1234"

    with FaultProxy(moto.endpoint) as proxy, MotoServer(check_credentials=True) as checking:
        check_object_store(
            StoreFixture(
                "s3",
                _threaded(lambda k, v: moto.put("conform", "root/" + k, v)),
                lambda: S3Store("conform", "root/", endpoint_url=moto.endpoint),
                open_throttled=lambda: (
                    S3Store("conform", "root/", endpoint_url=proxy.endpoint),
                    _failer(proxy, 503, "SlowDown"),
                ),
                open_wrong_credentials=wrong,
                account="conform",
            )
        )
    assert proxy.injected >= 6


def test_azure_on_azurite(azurite: Azurite) -> None:
    azurite.create_bucket("conform")
    wrong_key = "d3Jvbmcta2V5LW5vdC10aGUtcmVhbC1vbmU="

    def store(endpoint: str, key: str = azurite.key) -> AzureStore:
        # Pages of 500 blobs, so the 1005-object folder spans three pages.
        return AzureStore(
            "conform",
            "root/",
            account=azurite.account,
            account_key=key,
            endpoint_url=endpoint,
            page_size=500,
        )

    with FaultProxy(azurite.endpoint) as proxy:
        check_object_store(
            StoreFixture(
                "azure",
                _threaded(lambda k, v: azurite.put("conform", "root/" + k, v)),
                lambda: store(azurite.endpoint),
                open_throttled=lambda: (store(proxy.endpoint), _failer(proxy, 503, "ServerBusy")),
                open_wrong_credentials=lambda: (store(azurite.endpoint, wrong_key), wrong_key),
                account="devstoreaccount1",
            )
        )
    assert proxy.injected >= 6


def test_azure_with_entra_id_on_azurite_oauth(
    azurite_oauth: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same contract over HTTPS with Microsoft Entra ID bearer tokens (a managed
    identity's, from azure-identity) that Azurite's OAuth mode checks.  No throttling
    proxy: it would have to speak TLS."""
    azurite_oauth.create_bucket("conform")
    with TokenServer() as tokens:
        for name, value in tokens.azure_managed_identity_env().items():
            monkeypatch.setenv(name, value)

        def store() -> AzureStore:
            return AzureStore(
                "conform",
                "root/",
                account=azurite_oauth.account,
                endpoint_url=azurite_oauth.endpoint,
                ca_bundle=azurite_oauth.ca_file,
                credential="default",
                page_size=500,
            )

        check_object_store(
            StoreFixture(
                "azure-entra",
                _threaded(lambda k, v: azurite_oauth.put("conform", "root/" + k, v)),
                store,
                account="devstoreaccount1",
            )
        )
        assert tokens.issued >= 1


def test_gcs_on_fake_gcs_server(gcs_emulator: GCSEmulator) -> None:
    gcs_emulator.create_bucket("conform")

    def store(endpoint: str) -> GCSStore:
        # Pages of 400 objects, so the 1005-object folder spans three pages.
        return GCSStore("conform", "root/", endpoint_url=endpoint, anonymous=True, page_size=400)

    with FaultProxy(gcs_emulator.endpoint) as proxy:
        check_object_store(
            StoreFixture(
                "gcs",
                _threaded(lambda k, v: gcs_emulator.put("conform", "root/" + k, v)),
                lambda: store(gcs_emulator.endpoint),
                open_throttled=lambda: (store(proxy.endpoint), _failer(proxy, 429, "")),
                account="conform",
            )
        )
    assert proxy.injected >= 6


def test_http_store_on_a_local_server(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.jsonl"

    with S3TestServer(bucket="web") as server, FaultProxy(server.endpoint) as proxy:

        def put_many(items: Mapping[str, bytes]) -> None:
            _threaded(lambda k, v: server.put("web", "root/" + k, v))(items)
            # The manifest lists every object; sizes of half of them are left to HEAD.
            with manifest.open("a") as f:
                for i, (k, v) in enumerate(items.items()):
                    row = {"key": k, "size": len(v)} if i % 2 else {"key": k}
                    f.write(json.dumps(row) + "\n")

        def store(endpoint: str) -> HttpStore:
            return HttpStore(f"{endpoint}/web/root/", manifest=manifest)

        check_object_store(
            StoreFixture(
                "http",
                put_many,
                lambda: store(server.endpoint),
                open_throttled=lambda: (store(proxy.endpoint), _failer(proxy, 503, "SlowDown")),
            )
        )


def test_local_folder(tmp_path: Path) -> None:
    root = tmp_path / "root"

    def put(key: str, value: bytes) -> None:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp-write")
        tmp.write_bytes(value)
        os.replace(tmp, path)  # a new file, as a copy tool or a sync would write it

    check_object_store(StoreFixture("local", _threaded(put), lambda: LocalStore(root)))


def test_memory_store_and_its_fault_wrapper() -> None:
    # The test equipment passes the suite it helps to test with.
    bucket = MemoryBucket()

    def throttled() -> tuple[ObjectStore, Callable[[int, str], None]]:
        store = FaultyStore(MemoryStore(bucket))
        return store, lambda n, key: store.fail_next(n, key)

    check_object_store(
        StoreFixture("memory", bucket.put_many, lambda: MemoryStore(bucket), throttled)
    )
