"""A forward proxy nobody here wrote (tinyproxy, from Debian) between the loader and its
origin, as a company's network puts one: HTTPS through the tunnels its ``CONNECT`` opens,
behind Basic credentials, with ``CONNECT`` allowed to some ports only.  A proxy that
refuses says why at once (credentials, the tunnel's port), is not retried, and never shows
the credentials.  Subprocesses on 127.0.0.1, started and stopped by the tests."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import Nginx, TinyProxy, find_nginx, find_tinyproxy

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


def test_an_https_origin_through_a_proxy_s_tunnels(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTPS_PROXY names a proxy that asks for credentials and lets tunnels through to
    the origin's port alone: every image comes over HTTPS through its tunnels (each
    request it saw a ``CONNECT`` to the origin, a few connections for the whole epoch),
    the origin's certificate checked against the private CA as without a proxy."""
    with (
        Nginx(site, tls=True) as origin,
        TinyProxy(credentials=(USER, PASSWORD), connect_ports=[_port(origin.endpoint)]) as proxy,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url())
        options = {"manifest": f"{origin.endpoint}/train.jsonl", "ca_bundle": origin.ca_file}
        with al.ImageLoader(
            f"{origin.endpoint}/train/",
            batch_size=16,
            transform=al.Resize(32),
            store=al.StoreConfig(options=options),
            cache_dir=tmp_path / "cache",
        ) as loader:
            assert sum(len(labels) for _, labels in loader) == N_IMAGES
            stats = loader.stats()
        tunnels = proxy.requests()
    assert not stats.skipped and not stats.retries
    target = f"127.0.0.1:{_port(origin.endpoint)}"
    assert tunnels and set(tunnels) == {("CONNECT", target)}
    assert len(tunnels) < N_IMAGES  # connections kept, not one per image
    got = [a for a in origin.answers() if a.path.startswith("/train/") and a.status == 200]
    assert len(got) >= N_IMAGES


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
