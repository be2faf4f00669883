"""TLS for the lean HTTP client: a transport that lets OpenSSL decrypt straight into the
protocol's buffer.

asyncio's own TLS (``sslproto``) costs about twice the client CPU of a plain-HTTP GET of
110 KB; this one, 1.4–2.5 × over several runs (``benchmarks/bench_get_cpu.py``).  In paired
runs under the same client (``benchmarks/bench_tls_ab.py``), this transport costs 0.79–0.91 ×
the client CPU per GET of asyncio's own TLS, and about what uvloop's does (0.81–1.02 ×).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import TypeVar, cast

__all__ = ["TLSTransport", "connect_tls", "tcp_connect"]

P = TypeVar("P", bound=asyncio.BufferedProtocol)

_RECV_SIZE = 256 * 1024  # what one read of a TLS socket takes at most


class TLSTransport(asyncio.Transport):
    """TLS over a non-blocking socket, driven by the loop's reader callback.

    asyncio's own TLS (``sslproto``) runs a state machine in Python for every chunk it
    receives.  Here one ``recv_into`` takes what the socket has (usually a whole answer),
    one memory-BIO write hands it to OpenSSL, and OpenSSL decrypts record after record
    straight into the protocol's buffer (the body).  Enough of a transport for
    :class:`_Conn`: write, close, abort.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        protocol: asyncio.BufferedProtocol,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._tls = tls
        self._in = incoming
        self._out = outgoing
        self._protocol = protocol
        self._closing = False
        self._pending = bytearray()  # encrypted, not yet taken by the socket
        self._buf = bytearray(_RECV_SIZE)
        self._view = memoryview(self._buf)
        loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            n = self._sock.recv_into(self._buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if n == 0:
            self._in.write_eof()
        else:
            self._in.write(self._view[:n])
        protocol = self._protocol
        while not self._closing:
            buf = cast(memoryview, protocol.get_buffer(-1))  # ours return memoryviews
            try:
                got = cast(int, self._tls.read(len(buf), buf))  # into buf: a count
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                got = 0
            except ssl.SSLError as exc:
                self._lost(exc)
                return
            if got == 0:
                protocol.eof_received()
                self._lost(None)
                return
            protocol.buffer_updated(got)
        if self._out.pending:  # a key update or session ticket answered
            self._send(self._out.read())

    def write(self, data: bytes | bytearray | memoryview) -> None:  # type: ignore[override]
        if self._closing:
            return
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            self._lost(exc)
            return
        self._send(self._out.read())

    def _send(self, data: bytes) -> None:
        if not self._pending:  # the usual case: the socket takes a small request at once
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._lost(exc)
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._loop.add_writer(self._fd, self._on_writable)
        self._pending += data

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        del self._pending[:sent]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._lost(None)

    def abort(self) -> None:
        self._lost(None)

    def _lost(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)


async def tcp_connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to ``host:port`` (each address the name resolves
    to in turn; ``TCP_NODELAY`` set).

    Raises:
        OSError: no address took the connection (the last one's error).
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, type_, proto, _, address in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except BaseException as exc:
            sock.close()
            if not isinstance(exc, OSError):
                raise
            error = exc
            continue
        return sock
    raise error or OSError(f"cannot resolve {host}")


async def connect_tls(
    protocol_factory: Callable[[], P],
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    sock: socket.socket | None = None,
) -> tuple[TLSTransport, P]:
    """A TCP connection, its TLS handshake, and a protocol from ``protocol_factory`` on it
    (what ``loop.create_connection(..., ssl=context)`` does, on :class:`TLSTransport`);
    ``sock``: a socket connected already (a proxy's tunnel to ``host:port``), used instead
    of a new connection, and closed if the handshake fails."""
    loop = asyncio.get_running_loop()
    if sock is None:
        sock = await tcp_connect(host, port)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    await loop.sock_sendall(sock, outgoing.read())
                data = await loop.sock_recv(sock, _RECV_SIZE)
                if not data:
                    raise ConnectionResetError(
                        "connection closed during the TLS handshake"
                    ) from None
                incoming.write(data)
        if outgoing.pending:
            await loop.sock_sendall(sock, outgoing.read())
    except BaseException:
        sock.close()
        raise
    protocol = protocol_factory()
    transport = TLSTransport(loop, sock, tls, incoming, outgoing, protocol)
    protocol.connection_made(transport)
    return transport, protocol
