"""Where a request goes on its way to the server: through which proxy (the environment
as curl, requests and boto3 read it, ``NO_PROXY`` included, or a store's own), what a
proxy's refusal to open a tunnel means, where a redirect sends it (with which of its
headers), and the credentials a URL carries (``https://user:password@host/``) as the
``Authorization`` it sends.  Pure rules; :mod:`._http` sends the requests."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from yarl import URL

from .._base._errors import AccessDenied, StoreError, TransientStoreError

__all__ = [
    "MAX_REDIRECTS",
    "PROXY_LOGIN",
    "REDIRECTS",
    "Redirected",
    "basic",
    "proxy_for",
    "proxy_refusal",
    "redirected",
    "with_login",
]


def proxy_for(url: str, proxy: str | None = None) -> str | None:
    """The proxy that requests to ``url`` go through, or None: ``proxy`` where given (a
    store option; ``""``: none), else the environment's as curl, requests and boto3 read
    it (``HTTPS_PROXY`` for https, ``HTTP_PROXY`` for http, ``ALL_PROXY``, lower-case
    names too), unless ``NO_PROXY`` names the host."""
    if proxy is not None:
        return proxy or None
    import urllib.request

    parts = urlsplit(url)
    found = urllib.request.getproxies_environment()
    via = found.get(parts.scheme) or found.get("all")
    if not via or _bypassed(parts.hostname or "", parts.port, found.get("no", "")):
        return None
    return via


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` (comma-separated: ``*``, hosts and domains with or without a
    leading dot, ``host:port``, IP addresses and CIDR blocks) names ``host``, as curl and
    requests read it."""
    import ipaddress

    host = host.lower().strip("[]")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, want = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want and (not want.isdigit() or int(want) != port):
            continue
        name = name.lstrip(".").strip("[]")
        if host == name or host.endswith("." + name):
            return True
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(name, strict=False):
                return True
        except ValueError:
            pass
    return False


PROXY_LOGIN = (
    "give the proxy's credentials in its URL (http://user:password@proxy:3128, in "
    "HTTPS_PROXY or HTTP_PROXY, or the store option proxy=)"
)
"""What an error for a proxy that asks for credentials tells the user to do."""


def proxy_refusal(status: int, message: str, *, what: str, key: str | None) -> StoreError:
    """The error for a proxy's refusal to open the tunnel (``CONNECT``) an HTTPS request
    goes through: credentials asked for or refused (407, 401: :class:`AccessDenied`), the
    tunnel refused (403 and the like: a proxy lets ``CONNECT`` through to the ports it
    allows, often 443 alone), neither of which another try mends; the origin out of the
    proxy's reach (502, 503, 504: retried, as a server error is)."""
    detail = f"{status} {message}".strip()
    if status in (401, 407):
        return AccessDenied(
            f"the proxy on the way to {what} refused it ({detail}): {PROXY_LOGIN}",
            key=key,
            status=status,
        )
    if status >= 500:
        return TransientStoreError(
            f"the proxy on the way to {what} could not reach it ({detail})",
            key=key,
            status=status,
        )
    return StoreError(
        f"the proxy on the way to {what} would not open a tunnel to it ({detail}): a proxy "
        "lets HTTPS through (CONNECT) to the ports it allows, often 443 alone (squid's "
        "SSL_ports, tinyproxy's ConnectPort); ask for the origin's port, or name a proxy "
        "that allows it",
        key=key,
        status=status,
    )


REDIRECTS = (301, 302, 303, 307, 308)
"""The answers that send a request elsewhere, by their ``Location``."""
MAX_REDIRECTS = 10
"""Requests sent along one read's redirects at most, the first included: aiohttp's
``max_redirects`` (requests' is 30).  The last one's redirect is an error."""


class Redirected(StoreError):
    """A redirect (:data:`REDIRECTS`) that the lean client does not follow itself (aiohttp
    does): ``location``, the ``Location`` it gave.  The web store follows it
    (:func:`redirected`); to any other store it is an answer it did not expect."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        status: int | None = None,
        location: str = "",
    ) -> None:
        super().__init__(message, key=key, status=status)
        self.location = location


def redirected(url: URL, location: str, headers: Mapping[str, str]) -> tuple[URL, dict[str, str]]:
    """Where a redirect from ``url`` to ``location`` (absolute, or relative to ``url``)
    goes, and the headers the request takes there: all of them on the same origin; to
    another, none that would hand it a credential (``Authorization``, ``Cookie``), as
    aiohttp and requests do (a dataset hub's token is not for the CDN it redirects to)."""
    there = url.join(URL(location, encoded="%" in location))
    if there.origin() == url.origin():
        return there, dict(headers)
    private = ("authorization", "cookie", "proxy-authorization")
    return there, {k: v for k, v in headers.items() if k.lower() not in private}


def with_login(headers: dict[str, str], user: str | None, password: str | None) -> dict[str, str]:
    """``headers`` with a URL's credentials (``user``, ``password``, percent-encoded as a
    URL holds them) as Basic ``Authorization``, as curl and requests send them; unless
    there are none, or ``headers`` hold an ``Authorization`` already (the store option
    ``headers`` says what to send)."""
    if user is None or any(k.lower() == "authorization" for k in headers):
        return headers
    headers["Authorization"] = basic(user, password)
    return headers


def basic(user: str, password: str | None) -> str:
    """The Basic credentials of a URL's ``user`` and ``password`` (percent-encoded as a URL
    holds them), as an ``Authorization`` or ``Proxy-Authorization`` value."""
    login = f"{unquote(user)}:{unquote(password or '')}".encode()
    return "Basic " + base64.b64encode(login).decode("ascii")
