"""A forward proxy nobody here wrote (tinyproxy, from Debian) between the loader and its
origin, as a company's network puts one: HTTPS through the tunnels its ``CONNECT`` opens,
behind Basic credentials, with ``CONNECT`` allowed to some ports only.  A proxy that
refuses says why at once (credentials, the tunnel's port), is not retried, and never shows
the credentials.  Subprocesses on 127.0.0.1, started and stopped by the tests."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import pytest

import asyncloader as al
from asyncloader.testing import MotoServer, Nginx, TinyProxy, find_nginx, find_tinyproxy

from .conftest import N_IMAGES

pytestmark = pytest.mark.skipif(
    (find_tinyproxy() is None and not os.environ.get("ASYNCLOADER_REQUIRE_TINYPROXY"))
    or (find_nginx() is None and not os.environ.get("ASYNCLOADER_REQUIRE_NGINX")),
    reason="tinyproxy or nginx is not installed (.ci/run installs them)",
)

USER, PASSWORD = "trainer", "pr0xy-s3cr3t"


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _shown(exc: BaseException) -> str:
    """All that an error shows: its text, its causes' and its traceback."""
    return "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("tls", [True, False])
def test_an_origin_through_a_proxy_behind_credentials(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls: bool
) -> None:
    """HTTPS_PROXY (HTTP_PROXY) names a proxy that asks for credentials and lets tunnels
    through to the origin's port alone: every image comes over HTTPS through its tunnels
    (each request it saw a ``CONNECT`` to the origin, a few connections for the whole
    epoch), the origin's certificate checked against the private CA as without a proxy;
    over plain HTTP, every request goes to the proxy naming its URL."""
    with (
        Nginx(site, tls=tls) as origin,
        TinyProxy(credentials=(USER, PASSWORD), connect_ports=[_port(origin.endpoint)]) as proxy,
    ):
        monkeypatch.setenv("HTTPS_PROXY" if tls else "HTTP_PROXY", proxy.url())
        options = {"manifest": f"{origin.endpoint}/train.jsonl"}
        if tls:
            options["ca_bundle"] = origin.ca_file
        with al.ImageLoader(
            f"{origin.endpoint}/train/",
            batch_size=16,
            transform=al.Resize(32),
            store=al.StoreConfig(options=options),
            cache_dir=tmp_path / "cache",
        ) as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES
            stats = loader.stats()
        asked = proxy.requests()
    assert not stats.skipped and not stats.retries
    got = [a for a in origin.answers() if a.path.startswith("/train/") and a.status == 200]
    assert len(got) >= N_IMAGES
    if tls:
        target = f"127.0.0.1:{_port(origin.endpoint)}"
        assert asked and set(asked) == {("CONNECT", target)}
        assert len(asked) < N_IMAGES  # connections kept, not one per image
    else:
        assert {m for m, _ in asked} <= {"GET", "HEAD"}
        assert all(url.startswith(f"{origin.endpoint}/train") for _, url in asked)
        assert len(asked) == len(origin.answers())  # every one through the proxy


@pytest.mark.parametrize(
    ("case", "error", "says"),
    [
        ("wrong password", al.AccessDenied, "the proxy's credentials in its URL"),
        ("no credentials", al.AccessDenied, "the proxy's credentials in its URL"),
        ("port not allowed", al.StoreError, "would not open a tunnel"),
        ("plain http, no credentials", al.AccessDenied, "asks for credentials (407)"),
    ],
)
def test_a_proxy_that_refuses_says_why_at_once(
    site: Path, case: str, error: type[Exception], says: str
) -> None:
    """A proxy that refuses a tunnel (or, for plain HTTP, the request) for credentials
    wrong or missing, or for the origin's port, stops the loader at its start with an error
    that says which and what to give; asked once, not retried (no other try would pass);
    the password never shown."""
    tls = not case.startswith("plain")
    with Nginx(site, tls=tls) as origin:
        allowed = [443] if case == "port not allowed" else [_port(origin.endpoint)]
        with TinyProxy(credentials=(USER, PASSWORD), connect_ports=allowed) as proxy:
            via = {
                "wrong password": proxy.url(password="not-" + PASSWORD),
                "no credentials": proxy.endpoint,
                "port not allowed": proxy.url(),
                "plain http, no credentials": proxy.endpoint,
            }[case]
            options = {"manifest": f"{origin.endpoint}/train.jsonl", "proxy": via}
            if tls:
                options["ca_bundle"] = origin.ca_file
            with pytest.raises(error) as caught:
                with al.ImageLoader(
                    f"{origin.endpoint}/train/",
                    batch_size=16,
                    store=al.StoreConfig(options=options),
                ) as loader:
                    next(iter(loader))
            asked = proxy.requests()
    assert says in str(caught.value) and "proxy" in str(caught.value)
    assert not isinstance(caught.value, al.TransientStoreError)
    assert PASSWORD not in _shown(caught.value)
    assert len(asked) == 1, asked  # the manifest's request, once


@pytest.mark.parametrize("tls", [True, False])
def test_the_lean_client_goes_through_the_proxy_on_kept_connections(site: Path, tls: bool) -> None:
    """Our own HTTP client through tinyproxy, behind credentials: to an HTTPS origin in
    the tunnel its ``CONNECT`` opens (TLS with the origin inside it, the origin's
    certificate checked), to a plain-HTTP one by requests naming their URL; the bodies
    are the files' bytes, the connection kept for the next request (one tunnel for
    three GETs), and a tunnel refused for the port is the proxy's status, not a broken
    connection."""
    import asyncio

    from asyncloader._stores._lean_http import LeanHTTPClient, tls_context
    from asyncloader._stores._tunnel import Proxy, TunnelRefused

    names = sorted(p.name for p in (site / "train").rglob("*.jpg"))[:3]
    files = {n: next((site / "train").rglob(n)).read_bytes() for n in names}
    paths = {
        n: "/train/" + next((site / "train").rglob(n)).relative_to(site / "train").as_posix()
        for n in names
    }

    async def fetch(client: LeanHTTPClient) -> list[bytes]:
        try:
            return [bytes((await client.get(paths[n], {})).body) for n in names]
        finally:
            await client.close()

    with Nginx(site, tls=tls) as origin:
        port = _port(origin.endpoint)
        context = tls_context(origin.ca_file) if tls else None
        with TinyProxy(credentials=(USER, PASSWORD), connect_ports=[port]) as proxy:
            via = Proxy.of(proxy.url())
            assert via is not None and via.login and PASSWORD not in repr(via)
            scheme = "https" if tls else "http"
            client = LeanHTTPClient(scheme, "127.0.0.1", port, ssl_context=context, proxy=via)
            assert asyncio.run(fetch(client)) == [files[n] for n in names]
            asked = proxy.requests()
            if tls:
                elsewhere = LeanHTTPClient(scheme, "127.0.0.1", 1, ssl_context=context, proxy=via)
                with pytest.raises(TunnelRefused) as refused:
                    asyncio.run(fetch(elsewhere))
                assert refused.value.status == 403
    if tls:
        assert asked == [("CONNECT", f"127.0.0.1:{port}")]
    else:
        assert asked == [("GET", f"{origin.endpoint}{paths[n]}") for n in names]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://proxy.corp:3128", ("proxy.corp", 3128, None)),
        ("proxy.corp:3128", ("proxy.corp", 3128, None)),  # no scheme: http, as curl reads it
        ("http://proxy.corp", ("proxy.corp", 80, None)),
        ("http://u%40corp:p%3Ass@10.0.0.1:8080", ("10.0.0.1", 8080, "u@corp:p:ss")),
        ("http://user@proxy.corp:3128", ("proxy.corp", 3128, "user:")),
        ("https://proxy.corp:3129", None),  # TLS to the proxy: aiohttp's
        ("socks5://proxy.corp:1080", None),
    ],
)
def test_a_proxy_url_as_the_lean_client_takes_it(
    url: str, expected: tuple[str, int, str | None] | None
) -> None:
    import base64

    from asyncloader._stores._tunnel import Proxy

    proxy = Proxy.of(url)
    if expected is None:
        assert proxy is None
        return
    assert proxy is not None
    login = proxy.login and base64.b64decode(proxy.login.removeprefix("Basic ")).decode()
    assert (proxy.host, proxy.port, login) == expected


def test_s3_through_a_proxy_signs_what_the_origin_checks(
    moto: MotoServer, moto_dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 endpoint (moto, which checks every signature) behind HTTP_PROXY with
    credentials: the listing and every image go to the proxy naming their URL, and the
    requests it forwards still carry the signatures moto accepts."""
    with TinyProxy(credentials=(USER, PASSWORD)) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url())
        with al.ImageLoader(
            moto_dataset,
            batch_size=16,
            transform=al.Resize(32),
            store=al.StoreConfig(options={"endpoint_url": moto.endpoint}),
        ) as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES
            stats = loader.stats()
        asked = proxy.requests()
    assert not stats.skipped and not stats.retries
    objects = [u for m, u in asked if m == "GET" and u.endswith(".jpg")]
    assert len(set(objects)) == N_IMAGES
    assert all(u.startswith(f"{moto.endpoint}/") for _, u in asked)


def test_a_proxy_full_of_clients_is_waited_for_on_the_tunnels_it_keeps(
    site: Path, jpeg_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy that serves four clients at once (tinyproxy's ``MaxClients``) leaves a fifth
    connection in its listen queue, unanswered.  The lean client takes that for the
    proxy's limit: it cuts its connections to those open and sends every request on them
    — 48 at once, each answered with its file's bytes — and a loader's epoch through that
    proxy reads every image with no request failed or retried."""
    import asyncio

    from asyncloader._stores._lean_http import LeanHTTPClient, tls_context
    from asyncloader._stores._tunnel import Proxy

    files = sorted((site / "train").rglob("*.jpg"))[:48]
    paths = ["/train/" + p.relative_to(site / "train").as_posix() for p in files]

    root = _sized_site(jpeg_folder, tmp_path)
    with Nginx(root, tls=True) as origin:
        port = _port(origin.endpoint)
        with TinyProxy(credentials=(USER, PASSWORD), connect_ports=[port], max_clients=4) as proxy:
            client = LeanHTTPClient(
                "https",
                "127.0.0.1",
                port,
                ssl_context=tls_context(origin.ca_file),
                proxy=Proxy.of(proxy.url()),
            )
            assert asyncio.run(_fetch_all(client, paths)) == [p.read_bytes() for p in files]
            assert client._cap is not None and client._cap.limit <= 4
        with TinyProxy(credentials=(USER, PASSWORD), connect_ports=[port], max_clients=4) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url())
            stats = _epoch_through(origin)
    assert not stats.skipped and not stats.retries


def test_a_proxy_that_refuses_a_client_s_connections_past_a_number_is_waited_for_too(
    jpeg_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squid's ``maxconn`` rule answers a client's ``CONNECT`` past its number with 403,
    as it answers one to a port it does not allow.  Where the proxy opened tunnels to the
    same origin, the lean client takes it for the limit: it keeps to the tunnels open, and
    a loader's epoch through it reads every image with no request failed or retried.  A
    proxy that opens no tunnel to the origin at all is still a refusal, said at once."""
    import asyncio

    from asyncloader._stores._lean_http import LeanHTTPClient, tls_context
    from asyncloader._stores._tunnel import Proxy, TunnelRefused
    from asyncloader.testing import LimitProxy

    files = sorted(jpeg_folder.rglob("*.jpg"))[:48]
    paths = ["/train/" + p.relative_to(jpeg_folder).as_posix() for p in files]
    root = _sized_site(jpeg_folder, tmp_path)

    with Nginx(root, tls=True) as origin:
        port = _port(origin.endpoint)

        def client(proxy: LimitProxy) -> LeanHTTPClient:
            via = Proxy.of(proxy.endpoint)
            tls = tls_context(origin.ca_file)
            return LeanHTTPClient("https", "127.0.0.1", port, ssl_context=tls, proxy=via)

        with LimitProxy(max_clients=4) as proxy:
            lean = client(proxy)
            assert asyncio.run(_fetch_all(lean, paths)) == [p.read_bytes() for p in files]
            assert proxy.denied > 0 and lean._cap is not None and lean._cap.limit <= 4
        with LimitProxy(max_clients=0) as proxy, pytest.raises(TunnelRefused) as refused:
            asyncio.run(_fetch_all(client(proxy), paths))
        assert refused.value.status == 403 and proxy.tunnels == 0
        with LimitProxy(max_clients=4) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.endpoint)
            stats = _epoch_through(origin)
            denied = proxy.denied
    assert not stats.skipped and not stats.retries
    assert denied > 0  # the limit was met, and kept to


def _sized_site(jpeg_folder: Path, tmp_path: Path) -> Path:
    """A web server's folder: the JPEG folder as ``train/``, with a manifest of its keys and
    sizes beside it (no HEAD needed)."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "train").symlink_to(jpeg_folder, target_is_directory=True)
    rows = [
        {"key": p.relative_to(jpeg_folder).as_posix(), "size": p.stat().st_size}
        for p in sorted(jpeg_folder.rglob("*.jpg"))
    ]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


async def _fetch_all(client: Any, paths: list[str]) -> list[bytes]:
    """Every one of ``paths`` from the lean ``client`` at once, their bodies; then closed."""
    import asyncio

    try:
        answers = await asyncio.gather(*(client.get(path, {}) for path in paths))
        return [bytes(a.body) for a in answers]
    finally:
        await client.close()


def _epoch_through(origin: Nginx) -> al.Stats:
    """An epoch of ``origin``'s ``train/`` (listed by its manifest), through the proxy the
    environment names: every image read; the loader's stats."""
    options = {"manifest": f"{origin.endpoint}/train.jsonl", "ca_bundle": origin.ca_file}
    with al.ImageLoader(
        f"{origin.endpoint}/train/",
        batch_size=16,
        transform=al.Resize(32),
        store=al.StoreConfig(options=options),
    ) as loader:
        assert sum(len(labels) for _, labels in loader) == N_IMAGES
        return loader.stats()
