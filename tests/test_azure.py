"""Azure specifics on Azurite: URL forms, credential sources (connection string, key, SAS,
anonymous, Microsoft Entra ID on Azurite's OAuth mode), the SSD cache and the CLI by URL alone.  The loader's general behaviour runs on
Azure in test_loader.py and the store contract in test_conformance.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._stores._azure import parse_azure_url
from asyncloader._stores._azure_auth import (
    AZURITE_ACCOUNT,
    AzureCredentials,
    SharedKeySigner,
    parse_connection_string,
)
from asyncloader.testing import Azurite, FaultProxy, TokenServer

from .conftest import N_IMAGES


@pytest.fixture
def clean_azure_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AZURE_STORAGE_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def az_data(azurite: Azurite, jpeg_folder: Path) -> Azurite:
    """The JPEG folder in a private container 'priv' and a public one 'pub' (prefix 'train/')."""
    azurite.create_bucket("priv")
    azurite.create_bucket("pub", public=True)
    for container in ("priv", "pub"):
        azurite.upload_folder(container, jpeg_folder, "train/")
    return azurite


def _count(store: al.ObjectStore) -> int:
    async def main() -> int:
        try:
            return sum([1 async for _ in store.list()])
        finally:
            await store.close()

    return asyncio.run(main())


@pytest.mark.usefixtures("clean_azure_env")
def test_url_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_azure_url("az://acct/cont/train/x") == ("acct", "cont", "train/x", "")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "acct")
    assert parse_azure_url("az://cont/train/") == ("acct", "cont", "train/", "")
    assert parse_azure_url("az://acct/cont/train/") == ("acct", "cont", "train/", "")
    assert parse_azure_url("https://acct.blob.core.windows.net/cont/p/q?sv=1&sig=abc") == (
        "acct",
        "cont",
        "p/q",
        "sv=1&sig=abc",
    )
    with pytest.raises(ValueError, match="needs a container"):
        parse_azure_url("az://acct")
    store = al.open_store("https://acct.blob.core.windows.net/cont/train?sv=1&sig=SECRET")
    assert isinstance(store, al.AzureStore)
    assert store.url == "az://acct/cont/train/"
    assert "SECRET" not in repr(store) and "SECRET" not in repr(store.creds)
    assert isinstance(al.open_store("https://example.org/data/"), al.HttpStore)


@pytest.mark.usefixtures("clean_azure_env")
def test_credential_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    cs = parse_connection_string("UseDevelopmentStorage=true")
    assert cs["accountname"] == AZURITE_ACCOUNT
    creds = AzureCredentials.resolve(
        connection_string="DefaultEndpointsProtocol=https;AccountName=a1;AccountKey=a2V5;"
        "EndpointSuffix=core.chinacloudapi.cn"
    )
    assert (creds.account, creds.key, creds.endpoint) == (
        "a1",
        "a2V5",
        "https://a1.blob.core.chinacloudapi.cn",
    )
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "envacct")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?sv=2024&sig=x")
    creds = AzureCredentials.resolve()
    assert (creds.account, creds.key, creds.sas) == ("envacct", None, "sv=2024&sig=x")
    # An explicit key wins over the environment's SAS; anonymous sends nothing.
    assert AzureCredentials.resolve(account_key="a2V5").sas is None
    assert AzureCredentials.resolve(anonymous=True).sas is None
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT")
    with pytest.raises(al.AccessDenied, match="no Azure storage account"):
        AzureCredentials.resolve()
    with pytest.raises(al.AccessDenied, match="not valid base64"):
        SharedKeySigner("a", "not base64!")


@given(
    path=st.text(alphabet="abcXYZ09/-_. ", min_size=1, max_size=30),
    query=st.dictionaries(st.sampled_from(["comp", "Prefix", "marker"]), st.text(max_size=8)),
)
def test_shared_key_matches_the_reference_algorithm(path: str, query: dict[str, str]) -> None:
    """Our signer against a straight transcription of the documented string-to-sign."""
    import base64
    import hashlib
    import hmac

    key = base64.b64encode(b"k" * 64).decode()
    headers = {"x-ms-date": "Sun, 22 Nov 2026 00:00:00 GMT", "x-ms-version": "2024-11-04"}
    headers["x-ms-range"] = "bytes=0-9"
    headers["if-match"] = '"0x1"'
    SharedKeySigner("acct", key).sign("GET", "/c/" + path, query, headers)
    fields = ["GET", "", "", "", "", "", "", "", '"0x1"', "", "", ""]
    canon_headers = "".join(f"{k}:{headers[k]}\n" for k in sorted(headers) if k.startswith("x-ms-"))
    resource = "/acct/c/" + path
    for k in sorted(query, key=str.lower):
        resource += f"\n{k.lower()}:{query[k]}"
    to_sign = "\n".join(fields) + "\n" + canon_headers + resource
    sig = base64.b64encode(
        hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    assert headers["authorization"] == f"SharedKey acct:{sig}"


@pytest.mark.usefixtures("clean_azure_env")
def test_connection_string_from_the_environment(
    az_data: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az_data.connection_string)
    with al.ImageLoader(
        "az://priv/train/",
        batch_size=32,
        decode=al.DecodeConfig(workers=2),
    ) as loader:
        assert loader.url == f"az://{AZURITE_ACCOUNT}/priv/train/"
        assert sum(len(labels) for _, labels in loader) == N_IMAGES


@pytest.mark.usefixtures("clean_azure_env")
def test_sas_token_and_anonymous_access(az_data: Azurite) -> None:
    blob = pytest.importorskip("azure.storage.blob")
    sas = blob.generate_container_sas(
        az_data.account,
        "priv",
        account_key=az_data.key,
        permission=blob.ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    ep = az_data.endpoint
    store = al.AzureStore("priv", "train/", account=az_data.account, sas_token=sas, endpoint_url=ep)
    assert _count(store) == N_IMAGES
    public = al.AzureStore(
        "pub", "train/", account=az_data.account, anonymous=True, endpoint_url=ep
    )
    assert _count(public) == N_IMAGES
    private = al.AzureStore("priv", account=az_data.account, anonymous=True, endpoint_url=ep)
    with pytest.raises((al.ObjectNotFound, al.AccessDenied)) as info:
        _count(private)
    assert "az://devstoreaccount1/priv/" in str(info.value)


def test_second_epoch_and_later_run_come_from_the_cache(az_data: Azurite, tmp_path: Path) -> None:
    """Requests are counted at a proxy in front of Azurite: epoch 1 and a second run make
    none (the second run also reuses the saved listing)."""
    with FaultProxy(az_data.endpoint) as proxy:
        opts = {
            "account_key": az_data.key,
            "account": az_data.account,
            "endpoint_url": proxy.endpoint,
        }
        kw = dict(
            batch_size=16,
            decode=al.DecodeConfig(workers=2),
            # So epoch 1 is not already fetched during epoch 0.
            engine=al.EngineConfig(prefetch_batches=2),
            fetch=al.FetchConfig(max_inflight=16),
            cache_dir=tmp_path / "c",
            store=al.StoreConfig(options=opts),
        )
        with al.ImageLoader("az://devstoreaccount1/priv/train/", **kw) as loader:  # type: ignore[arg-type]
            assert sum(len(lab) for _, lab in loader) == N_IMAGES
            after_first = proxy.requests
            loader.set_epoch(0)  # the same epoch again: every sample was stored by now
            assert sum(len(lab) for _, lab in loader) == N_IMAGES
            assert proxy.requests == after_first
            stats = loader.stats()
        assert stats.cache_hits >= N_IMAGES
        with al.ImageLoader("az://devstoreaccount1/priv/train/", **kw) as loader:  # type: ignore[arg-type]
            assert sum(len(lab) for _, lab in loader) == N_IMAGES
        assert proxy.requests == after_first


@pytest.mark.usefixtures("clean_azure_env")
def test_warm_cli_by_url(az_data: Azurite, tmp_path: Path) -> None:
    env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING": az_data.connection_string}
    cmd = [sys.executable, "-m", "asyncloader", "warm", "az://priv/train/", "--all-objects"]
    out = subprocess.run(
        [*cmd, "--cache-dir", str(tmp_path / "c")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert str(N_IMAGES) in out.stdout + out.stderr
    assert az_data.key not in out.stdout + out.stderr


@pytest.mark.usefixtures("clean_azure_env")
def test_entra_id_through_a_managed_identity(
    azurite_oauth: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AZURE_STORAGE_AUTH_MODE=login``: DefaultAzureCredential finds the managed identity
    (an App Service identity endpoint, served locally), its token opens the container,
    one token serves every request, and the loader runs on it end to end."""
    with TokenServer() as tokens:
        for name, value in tokens.azure_managed_identity_env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AZURE_STORAGE_AUTH_MODE", "login")
        opts = {"endpoint_url": azurite_oauth.endpoint, "ca_bundle": azurite_oauth.ca_file}
        store = al.AzureStore("priv", "train/", account=azurite_oauth.account, **opts)
        assert "Entra ID" in repr(store.creds)

        async def read_one() -> bytes:
            try:
                objects = [o async for o in store.list()]
                first = objects[0]
                return bytes(await store.get(first.key, etag=first.etag))
            finally:
                await store.close()

        assert asyncio.run(read_one())[:2] == b"\xff\xd8"
        assert tokens.issued == 1
        url = f"az://{azurite_oauth.account}/priv/train/"
        with al.ImageLoader(
            url,
            batch_size=32,
            store=al.StoreConfig(options=opts),
        ) as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES


@pytest.mark.usefixtures("clean_azure_env")
def test_entra_id_tokens_are_checked(azurite_oauth: Azurite) -> None:
    """The emulator refuses an expired token (so the test above proves the token works),
    after one fresh try; and an identity that gives no token is a clear AccessDenied."""
    from azure.identity import ManagedIdentityCredential

    opts = {"endpoint_url": azurite_oauth.endpoint, "ca_bundle": azurite_oauth.ca_file}
    with TokenServer(lifetime=-120) as tokens:
        env = tokens.azure_managed_identity_env()
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            expired = al.AzureStore(
                "priv",
                account=azurite_oauth.account,
                credential=ManagedIdentityCredential(),
                **opts,
            )
            with pytest.raises(al.AccessDenied, match="az://devstoreaccount1/priv/"):
                _count(expired)
        assert tokens.issued == 2  # the first, and one more after the refusal
        tokens.identity_header = "another"  # the endpoint now refuses the identity
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            refused = al.AzureStore(
                "priv",
                account=azurite_oauth.account,
                credential=ManagedIdentityCredential(),
                **opts,
            )
            with pytest.raises(
                al.AccessDenied, match="could not get a token from Microsoft Entra ID"
            ):
                _count(refused)


def test_a_container_made_public_is_public_even_if_it_existed(azurite: Azurite) -> None:
    """The test kit's ``create_bucket(public=True)`` sets the access of a container that
    another test made private before (tests share the emulator within a process)."""
    azurite.create_bucket("once-private")
    azurite.put("once-private", "train/x.jpg", b"123")
    azurite.create_bucket("once-private", public=True)
    store = al.AzureStore(
        "once-private",
        "train/",
        account=azurite.account,
        anonymous=True,
        endpoint_url=azurite.endpoint,
    )
    assert _count(store) == 1
