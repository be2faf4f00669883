"""The lean HTTP client's read deadline: an answer must start within ``read_timeout`` and then
keep coming; a slow but moving answer is never cut, a stalled one always is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from asyncloader._stores._lean_http import LeanHTTPClient

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
