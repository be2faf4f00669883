"""Secrets (AWS secret keys, Azure account keys, SAS signatures, HTTP tokens) never appear in
logs, ``repr()``, ``stats()`` or exception texts, tracebacks and causes included."""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import Azurite, MotoServer, S3TestServer

from .conftest import jpeg_bytes

AWS_SECRET = "AwsSecretKey0123456789abcdefghijklmnopqrst"
HTTP_TOKEN = "HttpBearerToken0123456789"
URL_TOKEN = "UrlQueryToken0123456789"


def _all_text(exc: BaseException) -> str:
    """Everything a user could see of an exception: traceback, notes, causes, sub-errors."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


def _run_and_collect(loader_factory: object, texts: list[str]) -> None:
    """Run a loader that fails on a missing object; collect its reprs, stats and errors."""
    assert callable(loader_factory)
    with loader_factory(on_error="raise") as loader:
        texts += [repr(loader), repr(loader.store) if hasattr(loader, "store") else ""]
        with pytest.raises(al.AsyncLoaderError) as info:
            for _ in loader:
                pass
        texts.append(_all_text(info.value))
        texts += [repr(loader.stats()), loader.stats().summary()]
    with loader_factory(on_error="skip", max_failures=1) as loader:
        list(loader)
        texts += [repr(loader.stats()), loader.stats().summary()]


def _store_errors(store: al.ObjectStore, texts: list[str]) -> None:
    async def main() -> None:
        try:
            texts.append(repr(store))
            for call in (store.get("nope.jpg"), store.stat("nope.jpg")):
                try:
                    await call
                except al.StoreError as exc:
                    texts.append(_all_text(exc))
        finally:
            await store.close()

    asyncio.run(main())


def _manifest(tmp_path: Path) -> str:
    path = tmp_path / "m.jsonl"
    rows = [{"key": "a.jpg", "label": 0}, {"key": "missing.jpg", "label": 1}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_no_secret_leaks(
    moto: MotoServer,
    azurite: Azurite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blob = pytest.importorskip("azure.storage.blob")
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    manifest = _manifest(tmp_path)
    image = jpeg_bytes()

    # S3: the secret key comes from the environment.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    moto.create_bucket("sec")
    moto.put("sec", "a.jpg", image)

    def s3_loader(**kw: object) -> al.ImageLoader:
        opts = {"endpoint_url": moto.endpoint}
        return al.ImageLoader("s3://sec/", labels=manifest, batch_size=2, store_options=opts, **kw)  # type: ignore[arg-type]

    _run_and_collect(s3_loader, texts)
    _store_errors(al.S3Store("sec", endpoint_url=moto.endpoint), texts)
    with MotoServer(check_credentials=True) as checking:
        _store_errors(al.S3Store("sec", endpoint_url=checking.endpoint), texts)

    # Azure: account key, then a SAS token (a signature in every URL).
    azurite.create_bucket("sec")
    azurite.put("sec", "a.jpg", image)
    sas = blob.generate_container_sas(
        azurite.account,
        "sec",
        account_key=azurite.key,
        permission=blob.ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    sas_sig = dict(p.split("=", 1) for p in sas.split("&"))["sig"]
    base = {"account": azurite.account, "endpoint_url": azurite.endpoint}
    for creds in ({"account_key": azurite.key}, {"sas_token": sas}):
        for client in ("lean", "aiohttp"):
            opts = {**base, **creds, "http_client": client}

            def az_loader(opts: dict[str, object] = opts, **kw: object) -> al.ImageLoader:
                return al.ImageLoader(
                    "az://devstoreaccount1/sec/",
                    labels=manifest,
                    batch_size=2,
                    store_options=opts,
                    **kw,
                )  # type: ignore[arg-type]

            _run_and_collect(az_loader, texts)
            _store_errors(al.AzureStore("sec", **opts), texts)  # type: ignore[arg-type]
            texts.append(repr(al.AzureStore("sec", **opts).creds))  # type: ignore[arg-type]
    bad_sas = sas.replace(sas_sig, "AAAA" + sas_sig[4:])
    _store_errors(al.AzureStore("sec", **base, sas_token=bad_sas), texts)

    # Plain HTTP: a bearer token header and a token in the base URL's query.
    with S3TestServer(bucket="web") as server:
        server.put("web", "a.jpg", image)
        url = f"{server.endpoint}/web/?token={URL_TOKEN}"
        headers = {"Authorization": f"Bearer {HTTP_TOKEN}"}

        def web_loader(**kw: object) -> al.ImageLoader:
            opts = {"headers": headers}  # the labels manifest also lists the objects
            return al.ImageLoader(url, labels=manifest, batch_size=2, store_options=opts, **kw)  # type: ignore[arg-type]

        _run_and_collect(web_loader, texts)
        _store_errors(al.HttpStore(url, headers=headers), texts)

    texts += [r.getMessage() + str(r.args) for r in caplog.records]
    everything = "\n".join(texts)
    assert "missing.jpg" in everything and "nope.jpg" in everything  # the errors were seen
    for secret in (
        AWS_SECRET,
        azurite.key,
        sas_sig,
        bad_sas.split("sig=")[1][:20],
        HTTP_TOKEN,
        URL_TOKEN,
    ):
        assert secret not in everything, f"a secret leaked: {secret[:6]}…"
