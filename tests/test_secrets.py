"""Secrets (AWS secret keys, Azure account keys, SAS signatures, OAuth bearer tokens of GCS
and Entra ID, HTTP tokens) never appear in logs, ``repr()``, ``stats()`` or exception texts,
tracebacks and causes included."""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import (
    TOKEN_MARK,
    Azurite,
    FaultProxy,
    GCSEmulator,
    MotoServer,
    S3TestServer,
    TokenServer,
)

from .conftest import jpeg_bytes

AWS_SECRET = "AwsSecretKey0123456789abcdefghijklmnopqrst"
HTTP_TOKEN = "HttpBearerToken0123456789"
URL_TOKEN = "UrlQueryToken0123456789"


def failing_hook(data: bytes) -> object:
    raise ValueError("not an image I know")


def _all_text(exc: BaseException) -> str:
    """Everything a user could see of an exception: traceback, notes, causes, sub-errors."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


def _run_and_collect(loader_factory: object, texts: list[str]) -> None:
    """Run a loader that fails on a missing object; collect its reprs, stats and errors."""
    assert callable(loader_factory)
    with loader_factory(
        errors=al.ErrorConfig(on_error="raise"),
    ) as loader:
        texts += [repr(loader), repr(loader.store) if hasattr(loader, "store") else ""]
        with pytest.raises(al.AsyncLoaderError) as info:
            for _ in loader:
                pass
        texts.append(_all_text(info.value))
        texts += [repr(loader.stats()), loader.stats().summary()]
    with loader_factory(
        errors=al.ErrorConfig(on_error="skip", max_failures=1),
    ) as loader:
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


@pytest.mark.slow
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
        return al.ImageLoader(
            "s3://sec/", labels=manifest, batch_size=2, **kw, store=al.StoreConfig(options=opts)
        )  # type: ignore[arg-type]

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
            # The first in engine processes (their errors cross to the trainer as text);
            # the other ways in run the same store code in an inline engine (~1 s less each).
            first = creds.get("account_key") is not None and client == "lean"
            mode = al.EngineConfig(mode="process" if first else "inline")

            def az_loader(
                opts: dict[str, object] = opts, mode: al.EngineConfig = mode, **kw: object
            ) -> al.ImageLoader:
                return al.ImageLoader(
                    "az://devstoreaccount1/sec/",
                    labels=manifest,
                    batch_size=2,
                    engine=mode,
                    **kw,
                    store=al.StoreConfig(options=opts),
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
            return al.ImageLoader(
                url, labels=manifest, batch_size=2, **kw, store=al.StoreConfig(options=opts)
            )  # type: ignore[arg-type]

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


SIGNATURE = "5d41402abc4b2a76b9719d911017c592ae8d1f3c0e1b2a3f4d5c6b7a8f9e0d1c"
CREDENTIAL = "ASIAPRESIGNEDKEY0123%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
SECURITY_TOKEN = "IQoJb3JpZ2luX2VjEPresignedSessionToken0123456789"


def _presigned(endpoint: str, key: str) -> str:
    """A URL shaped like an S3 presigned GET (the light server ignores the query)."""
    return (
        f"{endpoint}/web/{key}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={CREDENTIAL}"
        f"&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
        f"&X-Amz-Security-Token={SECURITY_TOKEN}&X-Amz-Signature={SIGNATURE}"
    )


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_presigned_url_keys_are_never_shown(
    client: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The usual way to share a private bucket: a manifest of presigned URLs.  Keys name
    # objects in messages; their query strings are credentials.
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with S3TestServer(bucket="web") as server:
        server.put("web", "a.jpg", jpeg_bytes())
        server.put("web", "corrupt.jpg", b"\xff\xd8 not a JPEG")
        keys = {name: _presigned(server.endpoint, name) for name in ("a", "corrupt", "missing")}
        keys = {k: v.replace(f"/{k}?", f"/{k}.jpg?") for k, v in keys.items()}

        def manifest(*names: str) -> str:
            path = tmp_path / f"{'-'.join(names)}.jsonl"
            rows = [{"key": keys[n], "label": i} for i, n in enumerate(names)]
            path.write_text("\n".join(json.dumps(r) for r in rows))
            return str(path)

        def loader(names: tuple[str, ...], **kw: object) -> al.ImageLoader:
            kw.setdefault("decode", al.DecodeConfig(workers=1))
            return al.ImageLoader(
                f"{server.endpoint}/web/",
                labels=manifest(*names),
                batch_size=3,
                shuffle=False,
                **kw,
                store=al.StoreConfig(options={"http_client": client}),  # type: ignore[arg-type]
            )

        for names in (("a", "missing"), ("a", "corrupt")):
            with loader(
                names,
                errors=al.ErrorConfig(on_error="raise"),
            ) as ld:  # 404 / decode error
                texts += [repr(ld), repr(ld.dataset.samples)]
                with pytest.raises(al.AsyncLoaderError) as info:
                    list(ld)
                texts.append(_all_text(info.value))
        with loader(
            ("a", "missing", "corrupt"),
            errors=al.ErrorConfig(on_error="skip", max_failures=5),
        ) as ld:
            assert sum(len(labels) for _, labels in ld) == 1
            texts += [repr(ld.stats()), ld.stats().summary()]
        with loader(
            ("a", "missing", "corrupt"),
            errors=al.ErrorConfig(on_error="skip", max_failures=1),
        ) as ld:
            with pytest.raises(al.FailureBudgetExceeded) as budget:
                list(ld)
            texts.append(_all_text(budget.value))
        hooked = loader(
            ("a",),
            errors=al.ErrorConfig(on_error="raise"),
            decode=al.DecodeConfig(hook=failing_hook, sample_shape=(3, 8, 8)),
        )
        with hooked as ld, pytest.raises(al.DecodeError) as hook_error:
            list(ld)
        texts.append(_all_text(hook_error.value))

        report = al.warm(
            f"{server.endpoint}/web/",
            tmp_path / "cache",
            store_options={"manifest": manifest("a", "missing"), "http_client": client},
        )
        assert len(report.failed) == 1 and report.missing == []
        texts += [repr(report), report.summary()]

    texts += [r.getMessage() + str(r.args) for r in caplog.records]
    everything = "\n".join(texts)
    # The errors were seen, and name their objects.
    for shown in ("/web/missing.jpg?[query hidden]", "/web/corrupt.jpg?[query hidden]"):
        assert shown in everything
    assert "decode hook failed on" in everything and "stage=decode key=" in everything
    for secret in (SIGNATURE, "ASIAPRESIGNEDKEY", SECURITY_TOKEN, "X-Amz-Signature"):
        assert secret not in everything, f"a secret leaked: {secret[:12]}…"


SESSION_TOKEN = "FwoGZXIvYXdzSessionTokenValue0123456789abcdefghij"


def test_debug_logging_of_every_logger_shows_no_credentials(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    moto.create_bucket("dbg")
    moto.put("dbg", "x/a.jpg", jpeg_bytes())
    caplog.set_level(logging.DEBUG)
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    for name in ("botocore", "aiobotocore", "aiohttp", "urllib3", "asyncio", "asyncloader"):
        loggers.append(logging.getLogger(name))
    for lg in loggers:
        monkeypatch.setattr(lg, "level", logging.DEBUG)
        monkeypatch.setattr(lg, "disabled", False)

    async def calls() -> None:
        store = al.S3Store("dbg", endpoint_url=moto.endpoint)
        try:
            listed = [o async for o in store.list()]
            assert [o.key for o in listed] == ["x/a.jpg"]
            info = await store.stat("x/a.jpg")
            assert info.size == listed[0].size and info.etag == listed[0].etag
            assert len(await store.get("x/a.jpg", etag=info.etag)) == info.size
            assert len(await store.get("x/a.jpg", start=2, end=10)) == 8
            with pytest.raises(al.ObjectNotFound):
                await store.stat("x/nope.jpg")
        finally:
            await store.close()

    asyncio.run(calls())
    records = [r.getMessage() + str(r.args) for r in caplog.records]
    assert records, "DEBUG logging produced nothing: the check would see nothing"
    everything = "\n".join(records)
    for secret in (AWS_SECRET, SESSION_TOKEN, "Signature=", "AWS4-HMAC-SHA256\n"):
        assert secret not in everything, f"a secret leaked: {secret[:12]}…"


def _debug_everything(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    names = list(logging.root.manager.loggerDict)
    names += ["google", "google.auth", "urllib3", "azure", "azure.identity", "azure.core"]
    for lg in (logging.getLogger(name) for name in names):
        monkeypatch.setattr(lg, "level", logging.DEBUG)
        monkeypatch.setattr(lg, "disabled", False)


def _no_token_in(texts: list[str], caplog: pytest.LogCaptureFixture, tokens: TokenServer) -> None:
    records = [r.getMessage() + str(r.args) for r in caplog.records]
    assert records, "DEBUG logging produced nothing: the check would see nothing"
    assert tokens.handed_out, "no token was handed out: the check would see nothing"
    everything = "\n".join(records + texts)
    assert TOKEN_MARK not in everything, "an access token leaked"
    for token in tokens.handed_out:
        assert token not in everything and token[-40:] not in everything, "a token leaked"


def test_gcs_bearer_tokens_never_shown(
    gcs_emulator: GCSEmulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """google-auth's token exchange and our requests at DEBUG, a missing object and a
    token the service refuses twice: no access token in any log record or error."""
    gcs_emulator.create_bucket("sec")
    gcs_emulator.put("sec", "x/a.jpg", jpeg_bytes())
    _debug_everything(monkeypatch, caplog)
    texts: list[str] = []
    with TokenServer() as tokens, FaultProxy(gcs_emulator.endpoint) as proxy:
        key_file = str(tokens.google_service_account(tmp_path / "sa.json"))
        store = al.GCSStore("sec", endpoint_url=proxy.endpoint, credentials_file=key_file)

        async def calls() -> None:
            try:
                info = await store.stat("x/a.jpg")
                assert len(await store.get("x/a.jpg", etag=info.etag)) == info.size
                with pytest.raises(al.ObjectNotFound) as missing:
                    await store.get("x/nope.jpg")
                texts.append(_all_text(missing.value))
                for n in (1, 2):
                    proxy.revoke(f"Bearer {tokens.google_token(n)}")
                with pytest.raises(al.AccessDenied) as refused:
                    await store.get("x/a.jpg")
                texts.append(_all_text(refused.value))
                texts.append(repr(store))
            finally:
                await store.close()

        asyncio.run(calls())
        assert tokens.issued == 2
    _no_token_in(texts, caplog, tokens)


def test_entra_id_tokens_never_shown(
    azurite_oauth: Azurite, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """azure-identity's managed-identity request and our requests at DEBUG, and a missing
    blob: no access token in any log record or error."""
    _debug_everything(monkeypatch, caplog)
    texts: list[str] = []
    with TokenServer() as tokens:
        for name, value in tokens.azure_managed_identity_env().items():
            monkeypatch.setenv(name, value)
        store = al.AzureStore(
            "priv",
            "train/",
            account=azurite_oauth.account,
            endpoint_url=azurite_oauth.endpoint,
            ca_bundle=azurite_oauth.ca_file,
            credential="default",
        )

        async def calls() -> None:
            try:
                objects = [o async for o in store.list()]
                assert len(await store.get(objects[0].key)) == objects[0].size
                with pytest.raises(al.ObjectNotFound) as missing:
                    await store.stat("nope.jpg")
                texts.append(_all_text(missing.value))
                texts.append(repr(store) + repr(store.creds))
            finally:
                await store.close()

        asyncio.run(calls())
        assert tokens.issued == 1
    _no_token_in(texts, caplog, tokens)
