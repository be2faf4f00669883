"""Client CPU per S3 GET of a ~110 KB object, in one run, several ways.

* ``aiobotocore get_object`` — the SDK path (signing, event hooks, response parsing).
* ``aiohttp plain GET`` — unsigned, one shared session: the floor for aiohttp.
* ``botocore presigned URL + aiohttp`` — a common shortcut.
* ``S3Store (aiohttp)`` — our store, lean SigV4 signing, aiohttp transport.
* ``S3Store (lean)`` — our store, lean SigV4 signing, our HTTP/1.1 client (the default).

All at the same number of requests in flight against our light S3 server (a subprocess, so
its CPU is not counted); CPU is this process's user + system time per GET.
Run: ``python benchmarks/bench_get_cpu.py [--requests 3000] [--inflight 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable

from asyncloader import ObjectInfo, S3Store
from asyncloader._types import Blob
from asyncloader.testing import TEST_ENV, S3TestServer


async def _bounded(n: int, inflight: int, fn: Callable[[int], Awaitable[object]]) -> None:
    sem = asyncio.Semaphore(inflight)

    async def one(i: int) -> None:
        async with sem:
            await fn(i)

    await asyncio.gather(*(one(i) for i in range(n)))


async def _measure(n: int, inflight: int, fn: Callable[[int], Awaitable[object]]) -> float:
    await _bounded(min(n, 200), inflight, fn)  # warm up connections
    c0 = time.process_time()
    await _bounded(n, inflight, fn)
    return (time.process_time() - c0) / n


async def run(endpoint: str, keys: list[str], n: int, inflight: int) -> dict[str, float]:
    import aiohttp
    from aiobotocore.session import get_session

    out: dict[str, float] = {}
    k = len(keys)
    session = get_session()
    async with session.create_client("s3", endpoint_url=endpoint) as client:

        async def sdk(i: int) -> None:
            r = await client.get_object(Bucket="b", Key=keys[i % k])
            async with r["Body"] as body:
                await body.read()

        out["aiobotocore get_object"] = await _measure(n, inflight, sdk)

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight)) as http:

            async def plain(i: int) -> None:
                async with http.get(f"{endpoint}/b/{keys[i % k]}") as r:
                    await r.read()

            out["aiohttp plain GET (unsigned)"] = await _measure(n, inflight, plain)

            async def presigned(i: int) -> None:
                url = await client.generate_presigned_url(
                    "get_object", Params={"Bucket": "b", "Key": keys[i % k]}
                )
                async with http.get(url) as r:
                    await r.read()

            out["botocore presigned URL + aiohttp"] = await _measure(n, inflight, presigned)

    for name, http_client in (("S3Store (aiohttp)", "aiohttp"), ("S3Store (lean)", "lean")):
        store = S3Store("b", endpoint_url=endpoint, http_client=http_client)
        try:
            objs = [o async for o in store.list()]

            def ours(
                i: int, store: S3Store = store, objs: list[ObjectInfo] = objs
            ) -> Awaitable[Blob]:
                return store.get(objs[i % len(objs)].key)

            out[name] = await _measure(n, inflight, ours)
        finally:
            await store.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data-dir", default=os.path.join("cache", "bench-jpegs"))
    args = p.parse_args()
    from asyncloader._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=1000, classes=10, seed=0)
    runs: list[dict[str, float]] = []
    with S3TestServer(load=folder, bucket="b") as srv:
        keys = [k for k in srv.stats()["keys"] if k.endswith(".jpg")]
        for _ in range(args.repeat):
            runs.append(asyncio.run(run(srv.endpoint, keys, args.requests, args.inflight)))
    floor = statistics.median(r["aiohttp plain GET (unsigned)"] for r in runs)
    print(
        f"\nclient CPU per GET, ~110 KB objects, {args.inflight} in flight, median of {args.repeat}"
    )
    print(f"{'path':36s} {'ms/GET':>8s} {'x plain aiohttp':>16s}")
    for name in runs[0]:
        med = statistics.median(r[name] for r in runs)
        print(f"{name:36s} {med * 1e3:8.3f} {med / floor:16.2f}")


if __name__ == "__main__":
    main()
