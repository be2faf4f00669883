"""A forward proxy of our own for HTTPS tunnels that limits each client's connections as
squid's ``maxconn`` rule does (``acl over maxconn N`` and ``http_access deny over``): a
``CONNECT`` on a connection past the ``max_clients`` open ones is answered ``403
Forbidden``, the others get their tunnel.  Test equipment for that answer (squid itself is
not installed by the CI script); its start and stop are :class:`~._faultproxy.FaultProxy`'s.
"""

from __future__ import annotations

import asyncio

from ._faultproxy import FaultProxy

__all__ = ["LimitProxy"]

_DENIED = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n"
    b"Connection: close\r\n\r\naccess denied\n"
)


class LimitProxy(FaultProxy):
    """A ``CONNECT`` proxy on 127.0.0.1 (``endpoint``: ``http://127.0.0.1:PORT``) serving at
    most ``max_clients`` connections at once; each further one is answered 403 and closed.
    ``tunnels``: tunnels opened; ``denied``: connections refused.  Use as a context manager.
    """

    def __init__(self, max_clients: int) -> None:
        super().__init__("http://127.0.0.1:9")  # no upstream of its own: each CONNECT names one
        self.max_clients = max_clients
        self.tunnels = 0
        self.denied = 0
        self._open = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self._transports.add(writer.transport)
        self._open += 1  # counted from its accept, as squid counts a client's connections
        up_writer: asyncio.StreamWriter | None = None
        pump: asyncio.Task[None] | None = None
        try:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            method, _, rest = head.decode("latin-1").partition(" ")
            target = rest.partition(" ")[0]
            if method != "CONNECT" or self._open > self.max_clients:
                self.denied += 1
                writer.write(_DENIED)
                await writer.drain()
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            self._transports.add(up_writer.transport)
            self.tunnels += 1
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            pump = asyncio.create_task(self._copy(up_reader, writer))
            await self._copy(reader, up_writer)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            self._open -= 1
            await self._finish(writer, up_writer, pump)
