"""Retries against our fault-injecting S3 server: 503 storms, 429, 500, resets, truncation,
answers cut short; and the fault proxy, stopped, leaves no socket behind."""

from __future__ import annotations

import gc
import socket
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

import asyncloader as al
from asyncloader.testing import FaultProxy, PythonHTTPServer, S3TestServer

from .conftest import N_IMAGES


def _loader(server: S3TestServer, **kw: object) -> al.ImageLoader:
    """The retries are the fetcher's, the same in either engine mode: inline unless a test
    says otherwise (an engine process starts in ~1 s on 2 cores)."""
    kw.setdefault("engine", al.EngineConfig(mode="inline"))
    kw.setdefault("batch_size", 16)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("fetch", al.FetchConfig(backoff_base=0.005, backoff_cap=0.05))
    return al.ImageLoader(
        "s3://b/train/", **kw, store=al.StoreConfig(options={"endpoint_url": server.endpoint})
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rates",
    [
        {"slowdown": 0.6},
        {"throttle": 0.3, "error": 0.3},
        {"reset": 0.5},
        {"truncate": 0.5},
        {"short": 0.5},
        {"slowdown": 0.2, "reset": 0.2, "truncate": 0.2, "error": 0.1, "short": 0.1},
    ],
    ids=["503-storm", "429-and-500", "resets", "truncated-bodies", "short-answers", "mixed"],
)
def test_faults_are_retried_and_nothing_is_lost(
    light_server: S3TestServer, rates: dict[str, float]
) -> None:
    light_server.set_faults(rates, max_faults_per_key=3, seed=1)
    keys = sorted(light_server.stats()["keys"])
    index = {k.removeprefix("train/"): i for i, k in enumerate(keys)}
    with _loader(light_server, labels=index.__getitem__) as loader:
        labels = [x for _, lab in loader for x in lab.tolist()]
    # Snapshots after close: the next epoch was already being prefetched.
    stats = loader.stats()
    assert sorted(labels) == list(range(N_IMAGES))  # every sample exactly once
    counters = light_server.stats()["counters"]
    injected = sum(v for k, v in counters.items() if k.startswith("fault_"))
    assert injected > 10
    # Every injected fault was retried, except on requests abandoned in flight at close.
    assert injected - stats.max_inflight <= sum(stats.retries.values()) <= injected
    assert stats.skipped == {}


def test_answers_cut_short_are_asked_for_again(light_server: S3TestServer) -> None:
    # A middlebox that rewrites Content-Length: complete answers, half the bytes, on
    # objects and on listing pages alike.  Nothing is skipped, the pixels are the same.
    with _loader(light_server, shuffle=False) as loader:
        clean = [images.clone() for images, _ in loader]
    light_server.reset_stats()
    light_server.set_faults({"short": 0.4}, max_faults_per_key=2, seed=3)
    with _loader(light_server, shuffle=False, cache=al.CacheConfig(refresh_listing=True)) as loader:
        cut = [images.clone() for images, _ in loader]
    stats = loader.stats()
    counters = light_server.stats()["counters"]
    assert counters["fault_short"] > 10 and counters["list"] > 1
    assert stats.skipped == {} and stats.retries.get("short", 0) > 0
    assert len(cut) == len(clean) and all((a == b).all() for a, b in zip(cut, clean, strict=True))


def test_a_listing_page_that_stays_cut_short_is_a_clear_error(
    light_server: S3TestServer,
) -> None:
    light_server.set_faults({"short": 1.0}, max_faults_per_key=100)
    with pytest.raises(al.TransientStoreError, match="unreadable listing page of s3://b/train/"):
        _loader(light_server)


def test_retries_run_out_with_a_clear_error(light_server: S3TestServer) -> None:
    light_server.set_faults({"slowdown": 1.0}, max_faults_per_key=100)
    fetch = al.FetchConfig(max_attempts=3, backoff_base=0.001, backoff_cap=0.01)
    with (
        _loader(light_server, fetch=fetch) as loader,
        pytest.raises(
            al.Throttled, match=r"throttled on s3://b/train/class_0\d/img_\d+\.jpg"
        ) as info,
    ):
        next(iter(loader))
    assert any("gave up after 3 attempts" in n for n in info.value.__notes__)


def test_stalled_server_times_out_and_retries(light_server: S3TestServer) -> None:
    light_server.set_faults({"stall": 0.3}, max_faults_per_key=1, stall_seconds=30)
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=32,
        fetch=al.FetchConfig(backoff_base=0.001, hedge=False),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(
            options={"endpoint_url": light_server.endpoint, "read_timeout": 0.5}
        ),  # the read deadline alone
    ) as loader:
        n = sum(len(images) for images, _ in loader)
        assert n == N_IMAGES
        assert loader.stats().retries.get("transient", 0) > 0


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
def test_a_body_that_stalls_midway_is_abandoned_and_retried(
    light_server: S3TestServer, client: str
) -> None:
    # Headers and half the body, then nothing for 30 s: no request may hang the run.
    light_server.set_faults({"stall_body": 0.3}, max_faults_per_key=1, stall_seconds=30)
    t0 = time.monotonic()
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=32,
        fetch=al.FetchConfig(backoff_base=0.001, hedge=False),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(
            options={
                "endpoint_url": light_server.endpoint,
                "read_timeout": 0.5,
                "http_client": client,
            }
        ),  # the read deadline alone
    ) as loader:
        assert sum(len(images) for images, _ in loader) == N_IMAGES
    stalled = light_server.stats()["counters"]["fault_stall_body"]
    assert stalled > 0
    assert loader.stats().retries.get("transient", 0) > 0 and loader.stats().skipped == {}
    assert time.monotonic() - t0 < 25  # far less than one stall: they were abandoned


def test_latency_is_hidden_by_requests_in_flight(light_server: S3TestServer) -> None:
    light_server.set_faults({}, latency=0.05)
    with _loader(
        light_server,
        fetch=al.FetchConfig(max_inflight=64),
    ) as loader:
        sum(len(images) for images, _ in loader)
        # Not a speed assertion: the requests really overlapped.
        assert loader.stats().inflight_peak > 16


# --- Retry-After -----------------------------------------------------------------------------


def test_retry_after_names_its_wait_in_every_form() -> None:
    from email.utils import formatdate

    from asyncloader._stores._http import retry_after

    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after": "0.5"}) == 0.5
    assert retry_after({"x-ms-retry-after-ms": "250"}) == 0.25
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5  # the finer one
    later = retry_after({"retry-after": formatdate(time.time() + 30, usegmt=True)})
    assert later is not None and 25 < later <= 30
    assert retry_after({"retry-after": formatdate(time.time() - 30, usegmt=True)}) == 0.0
    assert retry_after({}) is None
    assert retry_after({"retry-after": "soon"}) is None


def test_a_throttled_retry_waits_what_the_answer_asked_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from asyncloader._stores import _retry

    waits: list[float] = []

    async def no_sleep(delay: float) -> None:
        waits.append(delay)

    # Only the retry loop's own sleeps (its module's name for asyncio).
    monkeypatch.setattr(_retry, "asyncio", SimpleNamespace(sleep=no_sleep))
    answers = iter([2.0, 60.0, None])

    async def attempt() -> str:
        asked = next(answers, "done")
        if asked == "done":
            return "ok"
        raise al.Throttled("busy", retry_after=asked)  # type: ignore[arg-type]

    config = al.FetchConfig(backoff_base=0.001, backoff_cap=5.0)
    assert asyncio.run(_retry.retrying(attempt, config)) == "ok"
    assert waits[0] >= 2.0  # at least what was asked
    assert waits[1] == 5.0  # ... up to the cap
    assert waits[2] <= 0.004  # nothing asked: the jittered backoff alone


@pytest.mark.parametrize("http_client", ["lean", "aiohttp"])
def test_retry_after_of_a_real_answer_reaches_the_retry(
    light_server: S3TestServer, monkeypatch: pytest.MonkeyPatch, http_client: str
) -> None:
    import asyncio

    from asyncloader import S3Store
    from asyncloader._stores import _retry
    from asyncloader.testing import FaultProxy

    waits: list[float] = []
    sleep = asyncio.sleep

    async def recorded(delay: float) -> None:
        waits.append(delay)
        await sleep(0)

    monkeypatch.setattr(_retry, "asyncio", SimpleNamespace(sleep=recorded))
    key = sorted(light_server.stats()["keys"])[0]
    with FaultProxy(light_server.endpoint) as proxy:
        proxy.fail_next(1, status=503, code="ServerBusy", headers={"Retry-After": "3"})
        proxy.fail_next(
            1, status=429, code="TooManyRequests", headers={"x-ms-retry-after-ms": "1200"}
        )

        async def stat() -> int:
            store = S3Store("b", endpoint_url=proxy.endpoint, http_client=http_client)
            try:
                return (await store.stat(key)).size
            finally:
                await store.close()

        assert asyncio.run(stat()) > 0
    assert len(waits) == 2 and waits[0] >= 3.0 and waits[1] >= 1.2, waits


def test_a_stopped_fault_proxy_leaves_no_socket_open(tmp_path: Path) -> None:
    """Clients that stopped reading a large answer, and one the proxy accepts as it stops:
    every socket of the proxy's is closed by ``stop()``, none left to the collector (whose
    ResourceWarning would fail whichever test ran then)."""
    (tmp_path / "big").write_bytes(b"x" * (16 << 20))
    with PythonHTTPServer(tmp_path) as origin:
        proxy = FaultProxy(origin.endpoint)
        proxy.start()
        where = urlsplit(proxy.endpoint)
        address = (str(where.hostname), int(where.port or 80))
        clients = []
        try:
            for _ in range(3):
                client = socket.create_connection(address)
                client.sendall(b"GET /big HTTP/1.1\r\nHost: origin\r\n\r\n")
                clients.append(client)
            time.sleep(0.3)  # the answers start, and stall: nobody reads them
            clients.append(socket.create_connection(address))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                proxy.stop()
                gc.collect()
        finally:
            for client in clients:
                client.close()
    assert [str(w.message) for w in caught] == []
