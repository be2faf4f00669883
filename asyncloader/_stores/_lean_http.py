"""A lean HTTP/1.1 GET client for the hot path: keep-alive connections, zero-copy bodies.

aiohttp spends ~0.3 ms of Python per 100 KB response (request and response objects, header
multidicts, a stream reader that joins chunks).  A training loader only ever sends GETs with
a handful of headers and reads bodies of a known length, so this client writes one request
line, parses the status and headers once, and lets the kernel ``recv_into`` the body's own
preallocated buffer (``asyncio.BufferedProtocol``: :mod:`._lean_conn`, one connection).
Connections are kept alive and reused;
any failure closes the connection and raises, so callers can retry on a fresh one.  Over
HTTPS the connection runs on :mod:`._tls`'s transport (OpenSSL decrypts into the body).

Through a forward proxy (:mod:`._tunnel`): an HTTPS origin in the tunnel ``CONNECT`` opens,
a plain-HTTP one by requests in absolute form; at most ``PROXY_CONNECTIONS`` of them, cut
to those open where the proxy leaves a new one unanswered (``_gate.ConnectionCap``: its
limit on clients).  Not supported (callers fall back to
aiohttp): a proxy spoken to over TLS, HTTP/2, compression.  A redirect
is not followed here: it is raised (``_http.Redirected``, with its ``Location``) for the
caller to follow, as the web store does.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque

from .._base._config import READ_TIMEOUT
from ._gate import ConnectionCap, ConnectionGate
from ._lean_conn import LeanConnection, LeanResponse, ProtocolError
from ._tls import connect_tls
from ._tunnel import Proxy, TunnelRefused, open_tunnel

__all__ = ["LeanHTTPClient", "LeanResponse", "ProtocolError", "tls_context"]

_CLOSING = 8
"""Answers after which a server that closes every connection (``Connection: close``) is
known as one: requests to it then go through a :class:`~._gate.ConnectionGate` of at most
``CLOSING_CONNECTIONS`` at once, fewer where the server queues them.  An HTTP/1.0 answer
without keep-alive says so by itself: the gate follows the first."""
CLOSING_CONNECTIONS = 16
CLOSING_START = 4
"""Requests at once through a new gate (grown as answers show no queue, up to
``CLOSING_CONNECTIONS``): each is a connection opened, and a server of this kind often
listens with a queue of five (``socketserver``'s, ``http.server``'s), whose overflow the
kernel drops and TCP resends only a second later."""
_RESENT = 0.9
"""Seconds a connection takes to open where its first handshake was dropped (a full
listen queue) and TCP sent it again, 1 s later."""
PROXY_PATIENCE = 2.0
"""Seconds a new connection through a proxy may take while others through it are open
(four times the slowest opened, where that is longer): past it, the proxy is taken to hold
it in its listen queue, at its limit of clients (``_gate.ConnectionCap``)."""
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
        cautious: Before the first answer, at most ``CLOSING_START`` requests at once (a
            server of unknown kind, which may close every connection and listen with a
            queue of five: a web server's), more as soon as one answer says it keeps
            connections alive.  Cloud stores, which always do, go without.
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
        cautious: bool = False,
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
        self._idle: deque[LeanConnection] = deque()
        self._closed = False
        self._closes = 0  # answers after which the server closed the connection, in a row
        self._gate: ConnectionGate | None = None  # set once the server closes every one
        # Cautious: a gate from the start, until an answer says whether the server keeps
        # connections alive (then none) or closes each (then it stays).
        self._provisional = cautious
        if cautious:
            self._gate = ConnectionGate(CLOSING_CONNECTIONS, CLOSING_START)
        self._connecting = asyncio.Semaphore(CONNECTING)
        # Through a proxy, whose count of clients is what limits them: a cap, cut where a
        # new tunnel goes unanswered while others work (``_gate``'s docstring).
        self._cap = ConnectionCap() if proxy is not None else None
        self._open = 0  # connections opened and not closed
        self._slowest_open = 0.0  # the longest a connection took to open, its turn not counted
        self._fastest_open = float("inf")  # the shortest, likewise
        self._waiters: deque[asyncio.Future[None]] = deque()  # requests waiting in _kept
        self._opening = 0  # connections being opened through the proxy
        self._tunneled = 0  # tunnels the proxy opened to this origin, ever
        self._settling: list[asyncio.Future[None]] = []  # waiting for an opening to settle

    async def _connect(self) -> LeanConnection:
        loop = asyncio.get_running_loop()
        proxy = self._proxy
        gate = self._gate
        at_once = gate.inflight if gate is not None else 0
        async with self._connecting, asyncio.timeout(self._connect_timeout):
            t0 = time.monotonic()
            if self._ssl is not None:
                tunnel = await open_tunnel(proxy, self._host, self._port) if proxy else None
                self._tunneled += tunnel is not None
                _, conn = await connect_tls(
                    LeanConnection, self._host, self._port, self._ssl, sock=tunnel
                )
            elif proxy is not None:  # plain HTTP: every request to the proxy
                _, conn = await loop.create_connection(LeanConnection, proxy.host, proxy.port)
            else:
                _, conn = await loop.create_connection(LeanConnection, self._host, self._port)
            self._opened_in(time.monotonic() - t0, at_once)
        return conn

    def _opened_in(self, seconds: float, at_once: int) -> None:
        """Note how long a connection took to open, with ``at_once`` requests in flight
        through the gate.  A server that closes every connection, whose connections open
        in milliseconds, took a second or more for this one: its listen queue was full
        and the handshake was dropped and sent again (TCP waits 1 s), so the gate never
        lets that many go at once again (:meth:`~._gate.ConnectionGate.hold_below`)."""
        self._slowest_open = max(self._slowest_open, seconds)
        gate = self._gate
        if gate is not None and seconds >= _RESENT and self._fastest_open < _RESENT / 10:
            gate.hold_below(at_once)
        self._fastest_open = min(self._fastest_open, seconds)

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
        cap = self._cap
        if cap is None:
            return await self._gated(data, method)
        await cap.acquire()  # through a proxy: at most its share of connections
        ok = False
        try:
            resp = await self._gated(data, method)
            ok = True
            return resp
        finally:
            cap.release(0.0 if ok else None)

    async def _gated(self, data: bytes, method: str) -> LeanResponse:
        """:meth:`_send` through the gate of a server that closes every connection."""
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
        conn, reused = await self._connection()
        ok = False
        try:
            resp = await conn.request(data, method != "HEAD", self._read_timeout)
            ok = True
        except ProtocolError:
            if not (reused and not conn.heard and method in ("GET", "HEAD")):
                raise
            self._drop(conn)
            conn = await self._fresh()
            resp = await conn.request(data, method != "HEAD", self._read_timeout)
            ok = True
        finally:
            if ok and not conn.closed and not self._closed:
                self._idle.append(conn)
                self._wake()
            else:
                self._drop(conn)
        self._learn(conn.keep_alive, conn.one_per_connection)
        return resp

    async def _kept(self) -> LeanConnection | None:
        """A kept-alive connection, or None where a new one is to be opened.  Through a
        proxy whose cap the open ones fill (a cut made after this request was let through),
        wait for one of them to come free, or close."""
        while True:
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    return c
                self._drop(c)  # closed by the server meanwhile
            cap = self._cap
            if cap is None or self._open + self._opening < cap.limit or self._closed:
                return None
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _wake(self) -> None:
        """Wake a request waiting in :meth:`_kept` (a connection came free, or closed)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _fresh(self) -> LeanConnection:
        """A new connection, for a request whose kept-alive one was closed under it (another
        kept one may be closed as well); where a proxy at its limit leaves none to open, one
        of those it serves."""
        while True:
            conn = await self._opened()
            if conn is not None:
                return conn
            conn = await self._kept()
            if conn is not None:
                return conn

    async def _connection(self) -> tuple[LeanConnection, bool]:
        """A connection for a request, and whether it is a kept-alive one."""
        while True:
            conn = await self._kept()
            if conn is not None:
                return conn, True
            if self._closed:
                raise ProtocolError("client is closed")
            conn = await self._opened()
            if conn is not None:
                return conn, False

    async def _opened(self) -> LeanConnection | None:
        """A new connection (counted open).  Through a proxy, one not opened within
        :data:`PROXY_PATIENCE` (or four times the slowest opened so far) while others
        through it are open is taken for the proxy's limit on its clients: the cap is cut
        to those open, and None says to wait for one of them."""
        t0 = time.monotonic()
        if self._cap is None:
            conn = await self._connect()
        else:
            alone = self._opening == 0 and self._open == 0
            self._opening += 1
            opening = asyncio.ensure_future(self._connect())
            refused = None
            try:
                while not opening.done():
                    await asyncio.wait((opening,), timeout=PROXY_PATIENCE / 8)
                    waited = time.monotonic() - t0
                    if not opening.done() and self._open > 0 and waited > self._patience():
                        self._cap.cut(self._open)
                        return None
                conn = opening.result()
            except TunnelRefused as exc:
                if exc.status != 403:
                    raise
                refused = exc
            finally:
                self._opening -= 1
                opening.cancel()  # (none left where it is done)
                for waiter in self._settling:  # an opening settled: whoever waits looks
                    if not waiter.done():
                        waiter.set_result(None)
                self._settling.clear()
                self._wake()  # a place to open another
            if refused is not None:
                await self._at_limit(refused, alone)
                return None
        self._open += 1
        return conn

    async def _at_limit(self, refused: TunnelRefused, alone: bool) -> None:
        """A tunnel ``refused`` 403 by the proxy: its limit on a client's connections
        (squid's ``maxconn`` rule, which counts the connections of a burst before it answers
        any) where it opened tunnels to this origin, or where others were being opened
        beside this one; else (asked alone) the refusal it is, of a port the proxy does not
        let through.  At the limit, the cap is cut to the connections open (one, where none
        is: the next is opened alone) and the request waits for one of them; where it opened
        tunnels before and none is open now, the request fails as a connection that broke
        (retried after a pause)."""
        assert self._cap is not None
        while self._tunneled == 0 and self._opening > 0:  # the others' answers decide
            await self._settled()
        if self._tunneled == 0 and alone:
            raise refused
        while self._open == 0 and self._opening > 0:  # tunnels opened, their TLS under way
            await self._settled()
        self._cap.cut(max(1, self._open))
        if self._open == 0 and self._tunneled > 0:
            raise ProtocolError(
                f"the proxy refused a tunnel ({refused}) to an origin it opened tunnels to: "
                "its limit on a client's connections"
            )

    async def _settled(self) -> None:
        """Wait until a connection being opened through the proxy is opened or fails."""
        waiter = asyncio.get_running_loop().create_future()
        self._settling.append(waiter)
        await waiter

    def _patience(self) -> float:
        """How long a new connection through a proxy may take while others are open."""
        return max(PROXY_PATIENCE, 4 * self._slowest_open)

    def _drop(self, conn: LeanConnection) -> None:
        """Close ``conn`` (once) and count it closed."""
        if not conn.dropped:
            conn.dropped = True
            self._open -= 1
            self._wake()
        conn.close()

    def _learn(self, kept: bool, one_per_connection: bool = False) -> None:
        """Count the answers after which the server closed the connection; past
        ``_CLOSING`` in a row, or at the first HTTP/1.0 answer without keep-alive (each
        request a new connection, the server's accept queue often small), requests go
        through a gate of ``CLOSING_START`` at once, adapted to the server's queue up to
        ``CLOSING_CONNECTIONS``."""
        self._closes = 0 if kept else self._closes + 1
        closing = one_per_connection or self._closes >= _CLOSING
        if self._provisional and self._gate is not None:
            if kept:  # the server keeps connections alive: no gate
                gate, self._gate = self._gate, None
                self._provisional = False
                gate.lift()
            elif closing:  # it closes every one: the gate stays, as the server's
                self._provisional = False
            return
        if closing and self._gate is None:
            self._gate = ConnectionGate(CLOSING_CONNECTIONS, CLOSING_START)

    async def close(self) -> None:
        self._closed = True
        while self._idle:
            self._drop(self._idle.pop())
        while self._waiters:
            self._wake()
        await asyncio.sleep(0)  # let transports run their close callbacks
