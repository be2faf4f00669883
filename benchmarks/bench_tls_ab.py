"""Paired A/B of the lean client's TLS transport against the event loop's own TLS.

The lean HTTP/1.1 client runs HTTPS on :mod:`asyncloader._stores._tls` (one ``recv_into``
per readable socket, OpenSSL decrypting records straight into the answer's body).  The
alternative is what ``loop.create_connection(..., ssl=context)`` gives: asyncio's
``sslproto`` on asyncio's loop, uvloop's own TLS on uvloop's.  This benchmark swaps only
the connection function under the same client, store and server, and measures this
process's CPU (user + system) per GET of a ~110 KB object, with the variants interleaved
round by round (their order rotating), against our light S3 server over HTTPS (a
subprocess; a CA made for the run).

Variants, on each loop (asyncio's, and uvloop's where installed):

* ``HTTP`` — the same store over plain HTTP: the denominator of every ratio.
* ``ours`` — the lean client's TLS transport (what the loader runs).
* ``loop's`` — ``create_connection(ssl=)``: the loop's own TLS.

Prints, per loop: the median CPU per GET of each variant, the median of the per-round
ratios to plain HTTP, and the median of the per-round ratio ours ÷ loop's — the figure the
decision rests on (below 1: ours costs less).

Run: ``python benchmarks/bench_tls_ab.py [--rounds 7] [--requests 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import ssl
import statistics
import time
from collections.abc import Callable
from typing import Any

from asyncloader import S3Store
from asyncloader._stores import _lean_http
from asyncloader._stores._tls import connect_tls as _OURS
from asyncloader.testing import TEST_ENV, S3TestServer


async def _loop_tls(
    factory: Callable[[], Any], host: str, port: int, context: ssl.SSLContext
) -> tuple[Any, Any]:
    """What the client would do without its own transport: the loop's TLS."""
    loop = asyncio.get_running_loop()
    return await loop.create_connection(factory, host, port, ssl=context, server_hostname=host)


async def _per_get(endpoint: str, ca_file: str | None, n: int, inflight: int) -> float:
    store = S3Store("b", endpoint_url=endpoint, ca_bundle=ca_file)
    try:
        objs = [o async for o in store.list()]
        sem = asyncio.Semaphore(inflight)

        async def one(i: int) -> None:
            async with sem:
                o = objs[i % len(objs)]
                await store.get(o.key, etag=o.etag)

        await asyncio.gather(*(one(i) for i in range(min(n, 200))))  # connections up
        c0 = time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        return (time.process_time() - c0) / n
    finally:
        await store.close()


def _measure(
    variant: str, loop_name: str, srv: S3TestServer, tls: S3TestServer, n: int, inflight: int
) -> float:
    if variant == "HTTP":
        coro = _per_get(srv.endpoint, None, n, inflight)
    else:
        vars(_lean_http)["connect_tls"] = _OURS if variant == "ours" else _loop_tls
        coro = _per_get(tls.endpoint, tls.ca_file, n, inflight)
    try:
        if loop_name == "uvloop":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro)
        return asyncio.run(coro)
    finally:
        vars(_lean_http)["connect_tls"] = _OURS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--data-dir", default=os.path.join("cache", "bench-jpegs"))
    args = p.parse_args()
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=1000, classes=10, seed=0)
    loops = ["asyncio"]
    try:
        import uvloop  # noqa: F401

        loops.append("uvloop")
    except ImportError:
        print("uvloop not installed: asyncio's loop only")
    variants = ["HTTP", "ours", "loop's"]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in loops}
    wall = time.monotonic()
    with (
        S3TestServer(load=folder, bucket="b") as srv,
        S3TestServer(load=folder, bucket="b", tls=True) as tls,
    ):
        for r in range(args.rounds):
            for loop_name in loops:
                row: dict[str, float] = {}
                order = variants[r % 3 :] + variants[: r % 3]  # rotate who goes first
                for v in order:
                    row[v] = _measure(v, loop_name, srv, tls, args.requests, args.inflight)
                runs[loop_name].append(row)
                print(
                    f"round {r + 1} {loop_name:7s} "
                    + "  ".join(f"{v} {row[v] * 1e3:.3f} ms" for v in variants),
                    flush=True,
                )
    print(
        f"\nclient CPU per GET, ~110 KB objects, {args.inflight} in flight, "
        f"{args.requests} GETs a variant, {args.rounds} rounds interleaved "
        f"({time.monotonic() - wall:.0f} s; peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)"
    )
    print(f"{'loop':8s} {'variant':8s} {'ms/GET':>8s} {'x HTTP':>8s}")
    for loop_name, rows in runs.items():
        for v in variants:
            med = statistics.median(row[v] for row in rows)
            ratio = statistics.median(row[v] / row["HTTP"] for row in rows)
            print(f"{loop_name:8s} {v:8s} {med * 1e3:8.3f} {ratio:8.2f}")
        ab = [row["ours"] / row["loop's"] for row in rows]
        print(
            f"{loop_name:8s} ours / loop's TLS: median {statistics.median(ab):.2f} "
            f"(rounds {min(ab):.2f}–{max(ab):.2f})"
        )


if __name__ == "__main__":
    main()
