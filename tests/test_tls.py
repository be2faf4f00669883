"""HTTPS on the lean client: our own TLS transport against the light server in its TLS mode
(a certificate from a CA made for the test), byte-exact, with faults retried; a server the
client does not trust is a clear error at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

import asyncloader as al
from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES


def _pixels(
    endpoint: str, event_loop: str = "asyncio", **options: object
) -> tuple[np.ndarray, al.Stats]:
    with al.ImageLoader(
        "s3://data/train/",
        engine=al.EngineConfig(event_loop=event_loop),  # type: ignore[arg-type]
        batch_size=16,
        transform=al.RandomResizedCrop(32),
        shuffle=False,
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": endpoint, "read_timeout": 2.0, **options}),
    ) as loader:
        pixels = np.concatenate([images.numpy().copy() for images, _ in loader])
    return pixels, loader.stats()


@pytest.fixture(scope="module")
def servers(jpeg_folder: Path) -> object:
    with (
        S3TestServer(load=jpeg_folder, bucket="data", prefix="train/") as plain,
        S3TestServer(load=jpeg_folder, bucket="data", prefix="train/", tls=True) as tls,
    ):
        yield plain, tls


def test_a_loader_over_https_gets_the_same_pixels_and_retries_faults(
    servers: tuple[S3TestServer, S3TestServer],
) -> None:
    plain, tls = servers
    assert tls.endpoint.startswith("https://")
    expected, _ = _pixels(plain.endpoint)
    rates = {"reset": 0.05, "truncate": 0.05, "short": 0.05, "stall_body": 0.03}
    tls.set_faults(rates, max_faults_per_key=1, stall_seconds=10)
    try:
        got, stats = _pixels(tls.endpoint, ca_bundle=tls.ca_file)
    finally:
        tls.set_faults()
    assert len(got) == N_IMAGES and np.array_equal(got, expected)  # byte-exact, in order
    assert stats.skipped == {} and sum(stats.retries.values()) > 0
    faults = tls.stats()["counters"]
    assert sum(faults.get(f"fault_{k}", 0) for k in rates) > 0


def test_the_loader_on_uvloop_over_https_and_http(
    servers: tuple[S3TestServer, S3TestServer],
) -> None:
    """``event_loop="uvloop"``: our TLS transport and HTTP client on uvloop's loop, the same
    pixels as on asyncio's, faults retried."""
    pytest.importorskip("uvloop")
    plain, tls = servers
    expected, _ = _pixels(plain.endpoint)
    got, _ = _pixels(plain.endpoint, event_loop="uvloop")
    assert np.array_equal(got, expected)
    tls.set_faults({"reset": 0.05, "truncate": 0.05}, max_faults_per_key=1)
    try:
        got, stats = _pixels(tls.endpoint, event_loop="uvloop", ca_bundle=tls.ca_file)
    finally:
        tls.set_faults()
    assert np.array_equal(got, expected) and stats.skipped == {}
    assert sum(stats.retries.values()) > 0
    with pytest.raises(ValueError, match="event_loop must be"):
        _pixels(plain.endpoint, event_loop="trio")


def test_aws_ca_bundle_is_honoured(
    servers: tuple[S3TestServer, S3TestServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, tls = servers
    monkeypatch.setenv("AWS_CA_BUNDLE", tls.ca_file)
    got, stats = _pixels(tls.endpoint)
    assert len(got) == N_IMAGES and stats.retries == {}


def test_an_untrusted_server_is_a_clear_error_at_once(
    servers: tuple[S3TestServer, S3TestServer],
) -> None:
    _, tls = servers

    async def listing() -> None:
        store = al.S3Store("data", "train/", endpoint_url=tls.endpoint)
        try:
            [o async for o in store.list()]
        finally:
            await store.close()

    t0 = time.monotonic()
    with pytest.raises(al.StoreError, match=r"not trusted.*ca_bundle") as info:
        asyncio.run(listing())
    assert not isinstance(info.value, al.TransientStoreError)  # not retried
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("name", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_requests_ca_bundle_is_honoured_by_the_web_and_gcs_stores(
    servers: tuple[S3TestServer, S3TestServer], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The web, GCS and Azure stores trust the CA that requests would (its environment
    variables: what Google's and Azure's Python SDKs and a plain requests.get read)."""
    plain, tls = servers
    key = next(k for k in plain.stats()["keys"] if k.endswith(".jpg"))
    rel = key.removeprefix("train/")
    for other in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # machines set them to their CAs
        monkeypatch.delenv(other, raising=False)

    async def read() -> tuple[bytes, bytes]:
        web = al.HttpStore(f"{tls.endpoint}/data/train/")
        gcs = al.GCSStore("data", "train/", endpoint_url=tls.endpoint, anonymous=True)
        try:
            return bytes(await web.get(rel)), bytes(await gcs.get(rel))
        finally:
            await web.close()
            await gcs.close()

    with pytest.raises(al.StoreError, match="not trusted"):
        asyncio.run(read())
    monkeypatch.setenv(name, tls.ca_file)
    by_web, by_gcs = asyncio.run(read())
    assert by_web == by_gcs and by_web[:2] == b"\xff\xd8"
    azure = al.AzureStore("data", account="acct", anonymous=True, endpoint_url=tls.endpoint)
    assert azure._ca_bundle == tls.ca_file
