"""A fault-injecting HTTP/1.1 proxy in front of any local server: test equipment.

Emulators such as moto and Azurite never throttle.  Put this proxy between a store and the
emulator, and it forwards every byte unchanged (so signatures still verify) except for the
requests it was told to fail: those are answered by the proxy itself with the given status
and service error code, and the connection is closed, as busy services do.

It runs its own event loop in a daemon thread, on 127.0.0.1, and parses just enough of each
request (request line, headers, ``Content-Length`` body) to tell requests apart on a
keep-alive connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ._equipment import Equipment

__all__ = ["FaultProxy"]


@dataclass
class _Rule:
    remaining: int
    status: int
    code: str
    path_contains: str
    headers: dict[str, str] | None = None


class FaultProxy(Equipment):
    """Forward ``127.0.0.1:port`` to ``upstream`` (``http://127.0.0.1:PORT[/base]``).

    ``endpoint`` is the upstream URL with the proxy's origin (the base path kept), so a store
    pointed at it reaches the same data.  Use as a context manager.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"FaultProxy forwards plain http:// only, not {upstream!r}")
        self._up_host = parts.hostname
        self._up_port = parts.port or 80
        self._base_path = parts.path.rstrip("/")
        self._rules: list[_Rule] = []
        self._holds: list[tuple[str, threading.Event]] = []
        self._lock = threading.Lock()
        self.injected = 0
        self.requests = 0
        self.targets: Counter[str] = Counter()  # "GET /bucket/key?query" of every request
        self.ranges: Counter[str] = Counter()  # the same, of requests with a Range header
        self.authorizations: Counter[str] = Counter()  # Authorization values seen
        self._revoked: set[str] = set()
        self._read_only: set[str] = set()
        self.endpoint = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._transports: set[asyncio.WriteTransport] = set()  # every connection's, both sides

    def start(self) -> None:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, "127.0.0.1", 0)
            )
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="asyncloader-faultproxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}{self._base_path}"

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with self._lock:
            for _, gate in self._holds:
                gate.set()

        async def shutdown() -> None:
            if self._server is not None:
                # No more accepts, then a turn of the loop for those under way, then the
                # close: Python 3.11's asyncio fails a connection accepted just before
                # Server.close() (an AssertionError in Server._attach) and leaves its socket
                # open for the collector.
                for sock in self._server.sockets:
                    asyncio.get_running_loop().remove_reader(sock.fileno())
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                self._server.close()
            # Closing the connections ends their handlers (EOF).  A connection accepted just
            # before the close gets its handler a few turns of the loop later, so the rounds
            # go on until no task is left; a handler whose peer stopped reading waits on
            # it, and aborting the connections ends it (never a cancel: asyncio's streams
            # would log the cancelled handler as an error).
            for _ in range(10):
                others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for writer in list(self._writers):
                    writer.close()
                if not others:
                    break
                _, late = await asyncio.wait(others, timeout=0.5)
                if late:
                    self._abort_all()
            # A closed connection whose peer stopped reading keeps its socket until its data
            # is sent: every socket the proxy opened is closed here, not by the collector
            # (a ResourceWarning in whichever test runs then).
            self._abort_all()
            await asyncio.sleep(0)  # abort() closes each socket on the loop's next turn

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _abort_all(self) -> None:
        """Close every connection the proxy has opened, both sides, at once (on its loop)."""
        for transport in list(self._transports):
            transport.abort()

    def fail_next(
        self,
        count: int,
        *,
        status: int = 503,
        code: str = "SlowDown",
        path_contains: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``count`` requests whose decoded target (path and query) contains
        ``path_contains`` with ``status`` and the error ``code`` (S3-style XML body and
        Azure's ``x-ms-error-code`` header) and ``headers`` (``Retry-After``, ...), then
        close their connections."""
        with self._lock:
            self._rules.append(_Rule(count, status, code, path_contains, headers))

    def revoke(self, authorization: str) -> None:
        """Answer 401 to every request that carries this ``Authorization`` value (a token
        the service no longer accepts: revoked, or rotated away)."""
        with self._lock:
            self._revoked.add(authorization)

    def read_only(self, authorization: str) -> None:
        """Answer 403 to every request but a GET or HEAD that carries this
        ``Authorization`` value (a token whose scope or role lets it read only: GCS answers
        a read-only token's upload so)."""
        with self._lock:
            self._read_only.add(authorization)

    def hold(self, path_contains: str) -> threading.Event:
        """Hold back requests whose decoded target contains ``path_contains`` until the
        returned event is set (the proxy sets it when it stops)."""
        gate = threading.Event()
        with self._lock:
            self._holds.append((path_contains, gate))
        return gate

    async def _wait_gates(self, path: str) -> None:
        with self._lock:
            gates = [g for s, g in self._holds if s in path]
        for gate in gates:
            if not gate.is_set():
                await asyncio.to_thread(gate.wait)  # stop() sets every gate

    def _pick(self, path: str, authorization: str, method: str = "GET") -> _Rule | None:
        with self._lock:
            self.requests += 1
            self.targets[f"{method} {path}"] += 1
            self.authorizations[authorization] += 1
            if authorization in self._revoked:
                self.injected += 1
                return _Rule(1, 401, "InvalidAuthenticationInfo", "")
            if authorization in self._read_only and method not in ("GET", "HEAD"):
                self.injected += 1
                return _Rule(1, 403, "AccessDenied", "")
            for rule in self._rules:
                if rule.remaining > 0 and rule.path_contains in path:
                    rule.remaining -= 1
                    self.injected += 1
                    return rule
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer: asyncio.StreamWriter | None = None
        pump: asyncio.Task[None] | None = None
        self._writers.add(writer)
        self._transports.add(writer.transport)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                target = lines[0].split(" ")[1] if lines[0].count(" ") >= 2 else "/"
                length = 0
                authorization = ""
                ranged = False
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value.strip())
                    elif name == "authorization":
                        authorization = value.strip()
                    elif name == "range":
                        ranged = True
                body = await reader.readexactly(length) if length else b""
                await self._wait_gates(unquote(target))
                method = lines[0].split(" ")[0]
                if ranged:
                    with self._lock:
                        self.ranges[f"{method} {unquote(target)}"] += 1
                rule = self._pick(unquote(target), authorization, method)
                if rule is not None:
                    xml = (
                        '<?xml version="1.0" encoding="utf-8"?>'
                        f"<Error><Code>{rule.code}</Code><Message>injected</Message></Error>"
                    ).encode()
                    extra = "".join(f"{k}: {v}\r\n" for k, v in (rule.headers or {}).items())
                    writer.write(
                        f"HTTP/1.1 {rule.status} Injected\r\nContent-Type: application/xml\r\n"
                        f"x-ms-error-code: {rule.code}\r\nContent-Length: {len(xml)}\r\n"
                        f"{extra}Connection: close\r\n\r\n".encode()
                        + (b"" if lines[0].startswith("HEAD ") else xml)  # a HEAD: no body
                    )
                    await writer.drain()
                    return
                if up_writer is None:
                    up_reader, up_writer = await asyncio.open_connection(
                        self._up_host, self._up_port
                    )
                    self._transports.add(up_writer.transport)
                    pump = asyncio.create_task(self._copy(up_reader, writer))
                up_writer.write(head + body)
                await up_writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            await self._finish(writer, up_writer, pump)

    async def _finish(
        self,
        writer: asyncio.StreamWriter,
        up_writer: asyncio.StreamWriter | None,
        pump: asyncio.Task[None] | None,
    ) -> None:
        """A connection's end: both sides closed, the upstream's copy waited for."""
        self._writers.discard(writer)
        for w in (up_writer, writer):
            if w is not None:
                w.close()
        if pump is not None:
            with contextlib.suppress(Exception):
                await pump

    @staticmethod
    async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Upstream → client, byte for byte; closes the client when upstream closes."""
        try:
            while chunk := await src.read(1 << 16):
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, RuntimeError):
            pass  # either side closed
        finally:
            dst.close()
