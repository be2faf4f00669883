"""The lean client's way through a forward proxy (``HTTPS_PROXY``, ``HTTP_PROXY``, or a
store's own ``proxy=``), as curl goes through one: to an HTTPS origin, a tunnel the proxy
opens on ``CONNECT host:port``, and TLS with the origin inside it (the proxy sees neither
the requests nor the data); to a plain-HTTP origin, each request to the proxy with its
target in absolute form (``GET http://host:port/path``).  Credentials in the proxy's URL
(``http://user:password@proxy:3128``) go as Basic ``Proxy-Authorization``.

A proxy reached over TLS itself (an ``https://`` proxy URL) is not spoken to here: aiohttp
takes those requests.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from yarl import URL

from ._routes import basic
from ._tls import tcp_connect

__all__ = ["Proxy", "TunnelRefused", "lean_route", "open_tunnel"]

_MAX_HEAD = 64 * 1024
"""The longest answer head a proxy may give to ``CONNECT``."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """A forward proxy the lean client goes through.

    Attributes:
        host, port: Where it listens.
        login: The ``Proxy-Authorization`` it is sent (Basic, from its URL's
            credentials), or None.
    """

    host: str
    port: int
    login: str | None = None

    @classmethod
    def of(cls, url: str) -> Proxy | None:
        """The proxy of ``url`` (``http://[user:password@]host[:port]``; port 80 unless
        given, as aiohttp and requests take it), or None where the lean client does not
        speak to it: an ``https://`` or ``socks`` proxy, or a URL without a host."""
        parsed = URL(url if "://" in url else f"http://{url}")
        if parsed.scheme != "http" or not parsed.host:
            return None
        login = basic(parsed.raw_user, parsed.raw_password) if parsed.raw_user is not None else None
        return cls(parsed.host, parsed.port or 80, login)

    def __repr__(self) -> str:  # never the credentials
        return f"Proxy({self.host}:{self.port}{', with a login' if self.login else ''})"


def lean_route(via: str | None) -> tuple[bool, Proxy | None]:
    """Whether the lean client takes the requests whose proxy is ``via`` (None: direct),
    and the proxy it goes through: not where it does not speak to that proxy
    (:meth:`Proxy.of`), whose requests aiohttp takes."""
    if via is None:
        return True, None
    proxy = Proxy.of(via)
    return proxy is not None, proxy


class TunnelRefused(Exception):
    """The proxy answered ``CONNECT`` with ``status`` (not 2xx): no tunnel.  Not an
    ``OSError``: whether another try may pass is the status's to say
    (:func:`~._routes.proxy_refusal`)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}".strip())
        self.status = status
        self.reason = reason


async def open_tunnel(proxy: Proxy, host: str, port: int) -> socket.socket:
    """A socket to ``host:port`` through ``proxy``'s tunnel: connected to the proxy, which
    has answered ``CONNECT`` with a 2xx; what is written to it next reaches the origin.

    Raises:
        TunnelRefused: the proxy answered otherwise (credentials asked for or refused, the
            port not allowed, the origin out of its reach).
        ConnectionResetError: it closed the connection before it answered.
        OSError: the proxy cannot be reached.
    """
    loop = asyncio.get_running_loop()
    sock = await tcp_connect(proxy.host, proxy.port)
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        login = f"Proxy-Authorization: {proxy.login}\r\n" if proxy.login else ""
        ask = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{login}\r\n"
        await loop.sock_sendall(sock, ask.encode("latin-1"))
        head = bytearray()
        while (end := head.find(b"\r\n\r\n")) < 0:
            if len(head) > _MAX_HEAD:
                raise ConnectionResetError("the proxy's answer to CONNECT is too long")
            data = await loop.sock_recv(sock, 4096)
            if not data:
                raise ConnectionResetError("the proxy closed the connection before it answered")
            head += data
        status_line = bytes(head[: head.find(b"\r\n")]).decode("latin-1")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ConnectionResetError(f"the proxy's answer is not HTTP: {status_line[:80]!r}")
        status = int(parts[1])
        if not 200 <= status < 300:
            raise TunnelRefused(status, parts[2] if len(parts) > 2 else "")
        if end + 4 < len(head):  # the origin speaks only after the client: not a tunnel
            raise ConnectionResetError("the proxy sent data before the tunnel was used")
    except BaseException:
        sock.close()
        raise
    return sock
