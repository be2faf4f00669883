"""One keep-alive HTTP/1.1 connection of the lean client (``_lean_http``): a request
written whole, the answer's status and headers parsed once, and its body read by the
kernel straight into the body's own buffer (``asyncio.BufferedProtocol``), chunked or of a
known length; a deadline on the gaps between its reads.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

from .._base._config import READ_TIMEOUT

__all__ = ["LeanConnection", "LeanResponse", "ProtocolError"]

_MAX_HEAD = 64 * 1024
_MAX_BODY = 1 << 34
"""The longest answer body read (16 GiB): a Content-Length or chunks past it fail the
request before anything that size is allocated."""


class ProtocolError(ConnectionError):
    """The connection broke, or the server's answer was not HTTP/1.1 we understand."""


@dataclass(slots=True)
class LeanResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes | bytearray


class LeanConnection(asyncio.BufferedProtocol):
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
        # A body that ends where the server closes the connection: an answer with neither
        # a length nor chunks, on a connection it closes (a proxy's error page, HTTP/1.0).
        self._to_close = False
        self._status = 0
        self._headers: dict[str, str] = {}
        self._waiter: asyncio.Future[LeanResponse] | None = None
        self._want_body = True
        self.heard = False  # any byte of the answer to the request in hand arrived
        self.keep_alive = True  # the last answer let the connection be used again
        # The last answer was HTTP/1.0 without keep-alive: a server that closes every
        # connection by its protocol, not now and then (a limit of requests per connection).
        self.one_per_connection = False
        self.dropped = False  # its client closed it and counted it closed

    # --- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ProtocolError(f"connection closed by the server{f': {exc}' if exc else ''}"))

    def eof_received(self) -> bool:
        self.closed = True
        if self._to_close and self._body is not None:  # the end of such a body
            self._finish()
            return False
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
        if body is not None and not self._chunked and not self._to_close:
            # Receive straight into the body: no join, no extra copy.
            return memoryview(body)[self._got :]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        self.heard = True
        if self._waiter is not None:
            self._progress = self._waiter.get_loop().time()
        if self._body is not None and self._to_close:
            self._body += self._scratch[:nbytes]
            if len(self._body) > _MAX_BODY:
                self._abort(ProtocolError(f"an answer without a length past {_MAX_BODY} bytes"))
            return
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
        self.one_per_connection = parts[0] == "HTTP/1.0" and connection != "keep-alive"
        self.keep_alive = connection != "close" and not self.one_per_connection
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
            if self.keep_alive:  # then nothing says where it ends
                self._abort(ProtocolError("answer without Content-Length"))
                return
            self._to_close = True  # it ends where the server closes the connection
            self._body = bytearray(rest)
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
        self._chunked = self._to_close = False
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
