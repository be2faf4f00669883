"""The lean HTTP client's read deadline: an answer must start within ``read_timeout`` and then
keep coming; a slow but moving answer is never cut, a stalled one always is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncloader._stores._lean_conn import LeanConnection
from asyncloader._stores._lean_http import (
    CLOSING_CONNECTIONS,
    CLOSING_START,
    LeanHTTPClient,
    LeanResponse,
    ProtocolError,
)

BODY = bytes(range(256)) * 64  # 16 KiB

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _server(answer: Answer) -> AsyncIterator[int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await answer(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def _head(n: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode()


async def _get(port: int, read_timeout: float) -> bytes:
    client = LeanHTTPClient("http", "127.0.0.1", port, read_timeout=read_timeout)
    try:
        return bytes((await client.get("/x", {})).body)
    finally:
        await client.close()


def test_a_slow_answer_that_keeps_coming_is_read_whole() -> None:
    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(_head(len(BODY)))
        for i in range(0, len(BODY), 2048):  # 8 pieces, 0.1 s apart: 0.8 s in all
            await asyncio.sleep(0.1)
            writer.write(BODY[i : i + 2048])
            await writer.drain()

    async def main() -> bytes:
        async with _server(trickle) as port:
            return await _get(port, read_timeout=0.4)

    assert asyncio.run(main()) == BODY


@pytest.mark.parametrize("where", ["before the answer", "mid-body"])
def test_a_stalled_answer_is_abandoned(where: str) -> None:
    async def stall(writer: asyncio.StreamWriter) -> None:
        if where == "mid-body":
            writer.write(_head(len(BODY)) + BODY[:1000])
            await writer.drain()
        await asyncio.sleep(30)

    async def main() -> None:
        async with _server(stall) as port:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(TimeoutError, match="stalled"):
                await _get(port, read_timeout=0.3)
            assert loop.time() - t0 < 5

    asyncio.run(main())


def test_a_refused_connection_is_a_transient_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncloader as al
    from asyncloader.testing import TEST_ENV, free_port

    for name, value in TEST_ENV.items():
        monkeypatch.setenv(name, value)
    store = al.S3Store("b", endpoint_url=f"http://127.0.0.1:{free_port()}")  # nobody there

    async def main() -> None:
        try:
            await store.get("x.jpg")
        finally:
            await store.close()

    with pytest.raises(al.TransientStoreError, match="ConnectionRefusedError"):
        asyncio.run(main())


# --- the parser, fed an answer in arbitrary pieces --------------------------------------


class _Wire:
    """A transport that takes what the connection writes and notes whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def _parsed(
    pieces: list[bytes], want_body: bool = True, eof: bool = False
) -> tuple[LeanConnection, LeanResponse]:
    """Feed ``pieces`` to a connection as a socket would (into the buffers it offers);
    ``eof``: then the server closes the connection."""
    conn = LeanConnection()
    conn.connection_made(_Wire())  # type: ignore[arg-type]
    answer = conn.request(b"GET / HTTP/1.1\r\n\r\n", want_body, 5.0)
    for piece in pieces:
        while piece and not answer.done():
            buf = conn.get_buffer(-1)
            n = min(len(buf), len(piece))
            buf[:n] = piece[:n]
            conn.buffer_updated(n)
            piece = piece[n:]
    if eof:
        conn.eof_received()
    assert answer.done(), "the answer did not end"
    return conn, answer.result()


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(
    body=st.binary(max_size=3000),
    chunks=st.one_of(st.none(), st.lists(st.integers(1, 700), min_size=1, max_size=8)),
    interim=st.lists(st.sampled_from([100, 102, 103]), max_size=2),
    version=st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
    connection=st.sampled_from(["", "keep-alive", "close"]),
    trailers=st.lists(st.sampled_from(["X-Checksum: abc", "Server-Timing: x;dur=1"]), max_size=2),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_an_answer_in_any_pieces_is_read_as_sent(
    body: bytes,
    chunks: list[int] | None,
    interim: list[int],
    version: str,
    connection: str,
    trailers: list[str],
    cuts: list[int],
) -> None:
    """Interim 1xx answers are passed over, chunked bodies (with extensions and trailers)
    joined, and whether the connection may be used again follows its version and
    ``Connection`` header: HTTP/1.0 closes unless it says keep-alive."""
    head = "".join(f"HTTP/1.1 {code} Info\r\nLink: </a>\r\n\r\n" for code in interim)
    head += f"{version} 200 OK\r\n" + (f"Connection: {connection}\r\n" if connection else "")
    if chunks is None:
        wire = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    else:
        wire, at, sizes = (head + "Transfer-Encoding: chunked\r\n\r\n").encode(), 0, iter(chunks)
        while at < len(body):
            n = next(sizes, 700)
            part = body[at : at + n]
            wire += f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n"
            at += n
        wire += b"0\r\n" + "".join(t + "\r\n" for t in trailers).encode() + b"\r\n"
    conn, resp = asyncio.run(_parsed(_pieces(wire, cuts)))
    assert resp.status == 200 and bytes(resp.body) == body
    kept = connection != "close" and (version == "HTTP/1.1" or connection == "keep-alive")
    assert conn.keep_alive == kept and conn.closed == (not kept)


@given(
    body=st.binary(max_size=100_000),
    how=st.sampled_from(["HTTP/1.0 200 OK", "HTTP/1.1 200 OK\r\nConnection: close"]),
    cuts=st.lists(st.integers(0, 200_000), max_size=12),
)
def test_an_answer_without_a_length_ends_where_the_server_closes(
    body: bytes, how: str, cuts: list[int]
) -> None:
    """Neither a length nor chunks, on a connection the server closes after it (a proxy's
    error page, an HTTP/1.0 server's dynamic page): the body is every byte up to the
    close, and the connection is not used again; on one that would stay open nothing
    says where the body ends: an error."""
    wire = f"{how}\r\nContent-Type: text/html\r\n\r\n".encode() + body
    conn, resp = asyncio.run(_parsed(_pieces(wire, cuts), eof=True))
    assert resp.status == 200 and bytes(resp.body) == body
    assert not conn.keep_alive and conn.closed


def test_a_closed_connection_cuts_short_an_answer_of_a_length() -> None:
    async def main() -> None:
        with pytest.raises(ProtocolError, match="before the answer ended"):
            await _parsed([b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nabc"], eof=True)

    asyncio.run(main())


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\nx",
        b"HTTP/1.1 2x0 OK\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
        b"SMTP 220 hello\r\n\r\n",
    ],
    ids=[
        "no-length-kept-alive",
        "status",
        "length",
        "negative",
        "too-long",
        "chunk-size",
        "not-http",
    ],
)
def test_a_malformed_answer_fails_the_request_at_once(wire: bytes) -> None:
    async def main() -> None:
        with pytest.raises(ProtocolError):
            await _parsed([wire])

    asyncio.run(main())


def test_malformed_over_tls_fails_at_once_not_at_the_read_timeout() -> None:
    """The same malformed length from an HTTPS server: the request fails within a second
    (the parser's error is the request's, not the TLS transport's callback's)."""
    import ssl

    import trustme

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def main() -> float:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1z\r\n\r\nx")
            await writer.drain()
            await asyncio.sleep(30)

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        client = LeanHTTPClient("https", "127.0.0.1", port, read_timeout=20, ssl_context=client_ctx)
        t0 = time.perf_counter()
        try:
            with pytest.raises(ProtocolError, match="Content-Length"):
                await client.get("/x", {})
            return time.perf_counter() - t0
        finally:
            await client.close()
            server.close()

    assert asyncio.run(main()) < 5.0


def test_a_kept_alive_connection_the_server_closed_is_replaced_at_once() -> None:
    """The server answers keep-alive, then closes the idle connection (its idle time-out):
    the next GET goes again on a new connection, without an error or a back-off."""
    opened = []

    async def main() -> list[bytes]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            opened.append(1)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(_head(2) + b"ok")
            await writer.drain()
            writer.close()  # says keep-alive (HTTP/1.1, no Connection: close), closes anyway

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = LeanHTTPClient("http", "127.0.0.1", port, read_timeout=5)
        try:
            got = [bytes((await client.get("/x", {})).body)]
            await asyncio.sleep(0.2)
            got.append(bytes((await client.get("/x", {})).body))
            return got
        finally:
            await client.close()
            server.close()

    assert asyncio.run(main()) == [b"ok", b"ok"]
    assert len(opened) == 2


def _closing_server_run(serial: bool, work: float) -> tuple[int, int, int]:
    """HTTP/1.0 answers, one connection each, ``work`` seconds per request: done one at a
    time (``serial``: a server under one lock) or all at once (a server far away).  After
    10 to learn, 300 requests at once through the client; returns the gate's limit after
    them, and the most requests the server had at once among the 300 and among their last
    100."""
    live, most, last, seen = [0], [0], [0], [0]

    async def main() -> int:
        lock = asyncio.Lock()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            live[0] += 1
            seen[0] += 1
            if seen[0] > 10:
                most[0] = max(most[0], live[0])
            if seen[0] > 210:
                last[0] = max(last[0], live[0])
            try:
                await reader.readuntil(b"\r\n\r\n")
                if serial:
                    async with lock:
                        await asyncio.sleep(work)
                else:
                    await asyncio.sleep(work)
                writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
            finally:
                writer.close()
                live[0] -= 1

        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
        port = server.sockets[0].getsockname()[1]
        client = LeanHTTPClient("http", "127.0.0.1", port, read_timeout=30)
        try:
            for _ in range(10):  # learn
                await client.get("/x", {})
            await asyncio.gather(*(client.get("/x", {}) for _ in range(300)))
            assert client._gate is not None
            return client._gate.limit
        finally:
            await client.close()
            server.close()

    return asyncio.run(main()), most[0], last[0]


def test_a_server_that_closes_every_connection_gets_a_few_at_once() -> None:
    """HTTP/1.0 answers, one connection each: after a few, the client opens at most
    CLOSING_CONNECTIONS at once, where it would open one per request in flight."""
    _, most, _ = _closing_server_run(serial=False, work=0.01)
    assert most <= CLOSING_CONNECTIONS


def test_a_closing_server_that_serves_one_at_a_time_gets_fewer_at_once() -> None:
    """A server that works on one request at a time (5 ms each): the gate comes down from
    CLOSING_CONNECTIONS to a few (more at once would only queue there); one whose answers
    take 100 ms however many are in flight (a round trip away: another region's) stays at
    or near the ceiling.  The client and the server share this process's event loop, so a
    busy machine's delays are in every answer's time: against answers of 30 ms, a suite
    on a loaded 2-core machine (10 ms more on average) read as a queue and took the gate
    down to 11; against 100 ms such delays stay inside the gate's margin (it shrinks where
    the mean answer is 4/3 of the fastest)."""
    limit, _, last = _closing_server_run(serial=True, work=0.005)
    assert limit <= 8 and last <= 9
    limit, _, _ = _closing_server_run(serial=False, work=0.1)
    assert limit >= CLOSING_CONNECTIONS - 4


def _burst(version: str, cautious: bool) -> tuple[int, int, bool]:
    """40 requests at once from a new client (``cautious``: a web store's) to a server that
    answers in 50 ms each, all at once, HTTP/1.0 (a connection per request) or HTTP/1.1
    (kept alive).  Returns the most connections the server had open before its first
    answer, the most it had at any time, and whether the client kept a gate."""
    live, most, before = [0], [0], [0]
    answered = asyncio.Event()

    async def main() -> bool:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            live[0] += 1
            most[0] = max(most[0], live[0])
            if not answered.is_set():
                before[0] = max(before[0], live[0])
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    await asyncio.sleep(0.05)
                    answered.set()
                    writer.write(f"HTTP/{version} 200 OK\r\nContent-Length: 2\r\n\r\nok".encode())
                    await writer.drain()
                    if version == "1.0":
                        break
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
                live[0] -= 1

        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
        port = server.sockets[0].getsockname()[1]
        client = LeanHTTPClient("http", "127.0.0.1", port, read_timeout=30, cautious=cautious)
        try:
            got = await asyncio.gather(*(client.get("/x", {}) for _ in range(40)))
            assert [bytes(r.body) for r in got] == [b"ok"] * 40
            return client._gate is not None
        finally:
            await client.close()
            server.close()

    gated = asyncio.run(main())
    return before[0], most[0], gated


def test_a_cautious_client_asks_a_few_at_once_until_the_server_says_what_it_is() -> None:
    """A web store's client does not know whether a server closes every connection (and
    listens with a queue of five, whose overflow costs a second): until the first answer
    it asks ``CLOSING_START`` at once.  An HTTP/1.0 server keeps that gate; an HTTP/1.1
    one that keeps connections alive has it lifted, and the rest go at once.  A cloud
    store's client (not cautious) sends the whole burst."""
    before, _, gated = _burst("1.0", cautious=True)
    assert before <= CLOSING_START and gated
    before, most, gated = _burst("1.1", cautious=True)
    assert before <= CLOSING_START and most > CLOSING_CONNECTIONS and not gated
    before, _, gated = _burst("1.1", cautious=False)
    assert before > CLOSING_CONNECTIONS and not gated


def test_a_handshake_a_full_listen_queue_dropped_holds_the_gate_below_it() -> None:
    """Against a server that closes every connection, whose connections open in a
    millisecond or two: one that took a second (TCP sent its dropped handshake again)
    while 8 requests were in flight means the server's listen queue was full, so the gate
    never lets 8 go at once again.  A second-long open with none faster before it (a far
    server, TLS) says nothing of the kind, and a client without a gate ignores it."""

    async def main() -> None:
        client = LeanHTTPClient("http", "127.0.0.1", 9, cautious=True)
        gate = client._gate
        assert gate is not None and gate.limit == CLOSING_START
        client._opened_in(1.05, 3)  # no fast open seen yet: a slow server, not a full queue
        assert gate.ceiling == CLOSING_CONNECTIONS
        client._opened_in(0.002, 2)
        gate.limit = 12  # grown meanwhile
        client._opened_in(1.01, 8)
        assert gate.ceiling == 7 and gate.limit == 7
        client._opened_in(1.01, 12)  # never raised by a later one
        assert gate.ceiling == 7
        client._opened_in(1.01, 1)
        assert gate.ceiling == gate.limit == 1
        plain = LeanHTTPClient("http", "127.0.0.1", 9)
        plain._opened_in(0.001, 1)
        plain._opened_in(1.2, 30)
        assert plain._gate is None
        await client.close()
        await plain.close()

    asyncio.run(main())
