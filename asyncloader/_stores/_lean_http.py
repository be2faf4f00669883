"""A lean HTTP/1.1 GET client for the hot path: keep-alive connections, zero-copy bodies.

aiohttp spends ~0.3 ms of Python per 100 KB response (request and response objects, header
multidicts, a stream reader that joins chunks).  A training loader only ever sends GETs with
a handful of headers and reads bodies of a known length, so this client writes one request
line, parses the status and headers once, and lets the kernel ``recv_into`` the body's own
preallocated buffer (``asyncio.BufferedProtocol``).  Connections are kept alive and reused;
any failure closes the connection and raises, so callers can retry on a fresh one.  Over
HTTPS the connection runs on :mod:`._tls`'s transport (OpenSSL decrypts into the body).

Through a forward proxy (:mod:`._tunnel`): an HTTPS origin in the tunnel ``CONNECT`` opens,
a plain-HTTP one by requests in absolute form.  Not supported (callers fall back to
aiohttp): a proxy spoken to over TLS, HTTP/2, compression.  A redirect
is not followed here: it is raised (``_http.Redirected``, with its ``Location``) for the
caller to follow, as the web store does.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

from .._base._config import READ_TIMEOUT
from ._gate import ConnectionGate
from ._tls import connect_tls
from ._tunnel import Proxy, open_tunnel

__all__ = ["LeanHTTPClient", "LeanResponse", "ProtocolError", "tls_context"]

_MAX_HEAD = 64 * 1024
_MAX_BODY = 1 << 34
"""The longest answer body read (16 GiB): a Content-Length or chunks past it fail the
request before anything that size is allocated."""
_CLOSING = 8
"""Answers after which a server that closes every connection (HTTP/1.0, ``Connection:
close``) is known as one: requests to it then go through a :class:`~._gate.ConnectionGate`
of at most ``CLOSING_CONNECTIONS`` at once, fewer where the server queues them."""
CLOSING_CONNECTIONS = 16
CONNECTING = 16
"""Connections being opened to one origin at once (their handshakes in progress; kept-alive
ones are reused without waiting): a burst of requests to a new origin, or to a server that
closes every connection, does not send 128 SYNs into a listen queue of five, whose overflow
the kernel drops and TCP resends only after 1, then 3, then 7 s (past the connect time-out
of a starved server: a transient failure and a retry)."""


def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """The TLS settings of every HTTPS connection: the system's trusted CAs (OpenSSL's
    default paths, ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` included), or ``ca_bundle`` (a PEM
    file) instead; hostnames checked."""
    return ssl.create_default_context(cafile=ca_bundle)


class ProtocolError(ConnectionError):
    """The connection broke, or the server's answer was not HTTP/1.1 we understand."""


@dataclass(slots=True)
class LeanResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes | bytearray


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection; at most one request at a time.

    Deadline: an answer must start within ``read_timeout`` and then keep coming — no gap
    between two reads may exceed it (aiohttp's ``sock_read``, the same rule).  A connection
    that stops sending mid-body is abandoned then, whatever the object's size, and the
    request fails with TimeoutError (retried by the caller).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._progress = 0.0  # loop time of the last bytes received [seconds]
        self._watchdog: asyncio.TimerHandle | None = None
        self._read_timeout = READ_TIMEOUT  # the client sets its own
        self.closed = False
        self._head = bytearray()
        self._scratch = bytearray(_MAX_HEAD)
        self._body: bytearray | None = None
        self._body_len = 0
        self._got = 0
        self._chunked = False
        self._status = 0
        self._headers: dict[str, str] = {}
        self._waiter: asyncio.Future[LeanResponse] | None = None
        self._want_body = True
        self.heard = False  # any byte of the answer to the request in hand arrived
        self.keep_alive = True  # the last answer let the connection be used again

    # --- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ProtocolError(f"connection closed by the server{f': {exc}' if exc else ''}"))

    def eof_received(self) -> bool:
        self.closed = True
        self._fail(ProtocolError("connection closed by the server before the answer ended"))
        return False

    def _watch(self) -> None:
        """Timer callback: fail the request if nothing arrived for ``read_timeout``."""
        self._watchdog = None
        if self._waiter is None or self._waiter.done():
            return
        loop = self._waiter.get_loop()
        idle = loop.time() - self._progress
        if idle >= self._read_timeout:
            self.closed = True
            waiter, self._waiter = self._waiter, None
            if self.transport is not None:
                self.transport.abort()
            waiter.set_exception(
                TimeoutError(f"no bytes received for {self._read_timeout:g} s (stalled)")
            )
            return
        self._watchdog = loop.call_later(self._read_timeout - idle, self._watch)

    def get_buffer(self, sizehint: int) -> memoryview:
        body = self._body
        if body is not None and not self._chunked:
            # Receive straight into the body: no join, no extra copy.
            return memoryview(body)[self._got :]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        self.heard = True
        if self._waiter is not None:
            self._progress = self._waiter.get_loop().time()
        if self._body is not None and not self._chunked:
            self._got += nbytes
            if self._got >= self._body_len:
                self._finish()
            return
        self._head += self._scratch[:nbytes]
        try:
            if self._body is None:
                self._parse_head()
            if self._chunked:
                self._parse_chunked()
        except ValueError as exc:  # a malformed status, length or chunk size: fail now
            self._abort(ProtocolError(f"a malformed answer: {exc}"))

    # --- parsing -------------------------------------------------------------------------

    def _parse_head(self) -> None:
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _MAX_HEAD:
                self._abort(ProtocolError("response headers too long"))
            return
        lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._abort(ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}"))
            return
        self._status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        rest = self._head[end + 4 :]
        if 100 <= self._status < 200 and self._status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows.
            self._head = rest
            if rest:
                self._parse_head()
            return
        self._headers = headers
        # HTTP/1.0 closes after each answer unless it says keep-alive; 1.1 when it says so.
        connection = headers.get("connection", "").lower()
        self.keep_alive = connection != "close" and (
            parts[0] != "HTTP/1.0" or connection == "keep-alive"
        )
        self._head = bytearray()
        if not self._want_body or self._status in (204, 304) or self._status == 101:
            self._body = bytearray()
            self._finish()
            return
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self._chunked = True
            self._body = bytearray()
            self._head = rest
            return
        if "content-length" not in headers:
            self._abort(ProtocolError("answer without Content-Length"))
            return
        length = headers["content-length"]
        if not length.isdigit() or int(length) > _MAX_BODY:
            self._abort(ProtocolError(f"an answer's Content-Length of {length[:40]!r}"))
            return
        self._body_len = int(length)
        self._body = bytearray(self._body_len)
        n = min(len(rest), self._body_len)
        self._body[:n] = rest[:n]
        self._got = n
        if self._got >= self._body_len:
            self._finish()

    def _parse_chunked(self) -> None:
        assert self._body is not None
        buf = self._head
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            field = bytes(buf[pos:eol]).split(b";")[0].strip()
            size = int(field, 16)  # ValueError for a malformed size: the answer fails
            if size < 0 or len(self._body) + size > _MAX_BODY:
                raise ValueError(f"a chunk of {size} bytes")
            if size == 0:
                # The trailer section (header lines, often none) ends at an empty line.
                done = eol + 4 if buf[eol + 2 : eol + 4] == b"\r\n" else -1
                if done < 0:
                    done = buf.find(b"\r\n\r\n", eol + 2)
                    if done < 0:
                        break  # trailers not complete
                    done += 4
                self._head = bytearray()
                self._finish()
                return
            if len(buf) < eol + 2 + size + 2:
                break
            self._body += buf[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        self._head = buf[pos:]

    def _finish(self) -> None:
        self._cancel_watchdog()
        waiter, self._waiter = self._waiter, None
        body, self._body = self._body, None
        self._chunked = False
        self._got = self._body_len = 0
        if not self.keep_alive:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(LeanResponse(self._status, self._headers, body or b""))

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _fail(self, exc: Exception) -> None:
        self._cancel_watchdog()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _abort(self, exc: Exception) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._fail(exc)

    # --- use -----------------------------------------------------------------------------

    def request(
        self, data: bytes, want_body: bool, read_timeout: float
    ) -> asyncio.Future[LeanResponse]:
        assert self.transport is not None
        assert self._waiter is None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[LeanResponse] = loop.create_future()
        self._waiter = fut
        self._read_timeout = read_timeout
        self._progress = loop.time()
        self._watchdog = loop.call_later(read_timeout, self._watch)
        self._want_body = want_body
        self._head = bytearray()
        self._body = None
        self.heard = False
        self.transport.write(data)
        return fut

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class LeanHTTPClient:
    """Keep-alive requests to one origin (``scheme://host[:port]``): GET and HEAD on the hot
    path, and the odd PUT or POST of a small body (a published manifest).

    Args:
        scheme: ``http`` or ``https``.
        host, port: The origin.
        read_timeout: Longest wait for the answer to start, and then between two reads of
            it: a stalled connection is abandoned, a slow but moving one is not [seconds].
        connect_timeout: Longest wait for a connection [seconds].
        ssl_context: TLS settings for ``https`` (default: :func:`tls_context`).
        proxy: The forward proxy to go through, or None (straight to the origin).
    """

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        *,
        read_timeout: float = READ_TIMEOUT,
        connect_timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        proxy: Proxy | None = None,
    ) -> None:
        if scheme not in ("http", "https"):
            raise ValueError(f"unsupported scheme {scheme!r}")
        self._host = host
        self._port = port
        self._ssl: ssl.SSLContext | None = (
            (ssl_context or tls_context()) if scheme == "https" else None
        )
        default = 443 if scheme == "https" else 80
        self.host_header = host if port == default else f"{host}:{port}"
        self._proxy = proxy
        # Through a proxy, a plain-HTTP request names its origin (absolute form) and
        # carries the proxy's credentials; an HTTPS one goes inside the tunnel as is.
        forward = proxy is not None and self._ssl is None
        self._origin = f"http://{self.host_header}" if forward else ""
        login = proxy.login if forward and proxy is not None else None
        self._proxy_login = f"Proxy-Authorization: {login}\r\n" if login else ""
        self._read_timeout = read_timeout
        self._connect_timeout = connect_timeout
        self._idle: deque[_Conn] = deque()
        self._closed = False
        self._closes = 0  # answers after which the server closed the connection, in a row
        self._gate: ConnectionGate | None = None  # set once the server closes every one
        self._connecting = asyncio.Semaphore(CONNECTING)

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        proxy = self._proxy
        async with self._connecting, asyncio.timeout(self._connect_timeout):
            if self._ssl is not None:
                tunnel = await open_tunnel(proxy, self._host, self._port) if proxy else None
                _, conn = await connect_tls(_Conn, self._host, self._port, self._ssl, sock=tunnel)
            elif proxy is not None:  # plain HTTP: every request to the proxy
                _, conn = await loop.create_connection(_Conn, proxy.host, proxy.port)
            else:
                _, conn = await loop.create_connection(_Conn, self._host, self._port)
        return conn

    async def get(
        self,
        target: str,
        headers: dict[str, str],
        *,
        method: str = "GET",
        body: bytes | bytearray | memoryview | None = None,
    ) -> LeanResponse:
        """Send one request for ``target`` (an encoded path + query) and read the answer;
        ``body`` (a PUT's or POST's) is sent after the headers, with its Content-Length.

        Raises:
            ProtocolError: the connection broke or the answer was malformed (the request may
                be retried on a new connection).
            TimeoutError: no answer within ``read_timeout``, or it stalled that long.
            TunnelRefused: the proxy on the way would not open a tunnel to the origin.
        """
        if self._closed:
            raise ProtocolError("client is closed")
        lines = [
            f"{method} {self._origin}{target} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            + self._proxy_login
        ]
        lines += [f"{k}: {v}\r\n" for k, v in headers.items()]
        if body is not None and not any(k.lower() == "content-length" for k in headers):
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        data = "".join(lines).encode("latin-1")
        if body is not None:
            data += body
        gate = self._gate
        if gate is None:
            return await self._send(data, method)
        await gate.acquire()  # a server that closes every connection: a few at once
        took = None
        try:
            t0 = time.monotonic()
            resp = await self._send(data, method)
            took = time.monotonic() - t0
            return resp
        finally:
            gate.release(took)

    async def _send(self, data: bytes, method: str) -> LeanResponse:
        """``data`` (a request) on a kept-alive connection, or a new one.  A kept-alive
        connection the server closed meanwhile (its idle time-out, a last request) fails
        before any byte of an answer: a GET or HEAD is then sent again at once on a new
        connection, not left to the caller's back-off."""
        conn = None
        while self._idle:
            c = self._idle.pop()
            if not c.closed:
                conn = c
                break
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        ok = False
        try:
            resp = await conn.request(data, method != "HEAD", self._read_timeout)
            ok = True
        except ProtocolError:
            if not (reused and not conn.heard and method in ("GET", "HEAD")):
                raise
            conn.close()
            conn = await self._connect()
            resp = await conn.request(data, method != "HEAD", self._read_timeout)
            ok = True
        finally:
            if ok and not conn.closed and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
        self._learn(conn.keep_alive)
        return resp

    def _learn(self, kept: bool) -> None:
        """Count the answers after which the server closed the connection; past
        ``_CLOSING`` in a row (an HTTP/1.0 server: each request a new connection, its
        accept queue small), requests go through a gate of at most ``CLOSING_CONNECTIONS``
        at once, adapted to the server's queue."""
        self._closes = 0 if kept else self._closes + 1
        if self._closes >= _CLOSING and self._gate is None:
            self._gate = ConnectionGate(CLOSING_CONNECTIONS)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
        await asyncio.sleep(0)  # let transports run their close callbacks
