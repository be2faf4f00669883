"""Client CPU per GET of a ~110 KB object, S3, Azure Blob and GCS, in one run, several ways.

S3, against our light S3 server (a subprocess):

* ``aiobotocore get_object`` — the SDK path (signing, event hooks, response parsing).
* ``aiohttp plain GET`` — unsigned, one shared session: the floor for aiohttp.
* ``botocore presigned URL + aiohttp`` — a common shortcut.
* ``S3Store (aiohttp)`` — our store, lean SigV4 signing, aiohttp transport.
* ``S3Store (lean)`` — our store, lean SigV4 signing, our HTTP/1.1 client (the default).
* ``... (HTTPS)`` — the plain aiohttp GET and our store against the same server in its TLS
  mode (a certificate from a CA made for the run, trusted through ``ca_bundle``).
* ``... (uvloop)`` — our store on uvloop's event loop instead of asyncio's, if installed.
* ``GCSStore (lean[, bearer]) on this server`` — our GCS store's downloads of the same
  objects from the same server (it answers GCS media downloads too): the two stores' client
  CPU side by side, the server's behaviour equal.
* ``TLS floor: decrypt only`` — what no HTTPS client can avoid: the records of a ~110 KB
  answer handed to OpenSSL and decrypted into a buffer, in-process over memory BIOs (the
  same TLS version and cipher the server negotiates), no socket and no HTTP.

Azure, against Azurite (Microsoft's emulator, a node subprocess) with a public container:

* ``azure-storage-blob aio download_blob`` — the official SDK, SharedKey.
* ``aiohttp plain GET (anonymous)`` — unsigned, one shared session: the floor for aiohttp.
* ``AzureStore (aiohttp)`` / ``AzureStore (lean)`` — our store, SharedKey-signed.

Google Cloud Storage, against fake-gcs-server (a Go subprocess):

* ``aiohttp plain GET (anonymous)`` — the media download URL, one shared session.
* ``GCSStore (aiohttp, bearer)`` / ``GCSStore (lean, bearer)`` — our store with a token from
  google-auth (a service-account key exchanged at a local token endpoint), as on Google.
* ``GCSStore (lean, anonymous)`` — our store with no token (public buckets).

All at the same number of requests in flight; server CPU is not counted (another process);
CPU is this process's user + system time per GET.  The ratio column compares each path to
the plain aiohttp GET of its own service, measured in the same run.
Run: ``python benchmarks/bench_get_cpu.py [--store s3|azure|gcs|all] [--requests 3000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

from asyncloader import AzureStore, GCSStore, ObjectInfo, ObjectStore, S3Store
from asyncloader._base._types import Blob
from asyncloader.testing import TEST_ENV, Azurite, GCSEmulator, S3TestServer, TokenServer


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


async def run(
    endpoint: str, keys: list[str], n: int, inflight: int, key_file: str = ""
) -> dict[str, float]:
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
        out[name] = await _measure_store(store, n, inflight)
    # The GCS store's downloads of the same objects from the same server.
    gcs_stores = {
        "GCSStore (lean) on this server": GCSStore("b", endpoint_url=endpoint, anonymous=True)
    }
    if key_file:
        gcs_stores["GCSStore (lean, bearer) on this server"] = GCSStore(
            "b", endpoint_url=endpoint, credentials_file=key_file
        )
    for name, gcs in gcs_stores.items():
        try:
            out[name] = await _measure(n, inflight, lambda i, g=gcs: g.get(keys[i % k]))
        finally:
            await gcs.close()
    return out


async def run_tls(
    endpoint: str, tls_endpoint: str, ca_file: str, keys: list[str], n: int, inflight: int
) -> dict[str, float]:
    """The plain aiohttp GET and our store over HTTPS (and our store over HTTP, for the
    ratio in the same loop)."""
    import aiohttp

    from asyncloader._stores._lean_http import tls_context

    out: dict[str, float] = {}
    k = len(keys)
    connector = aiohttp.TCPConnector(limit=inflight, ssl=tls_context(ca_file))
    async with aiohttp.ClientSession(connector=connector) as http:

        async def plain(i: int) -> None:
            async with http.get(f"{tls_endpoint}/b/{keys[i % k]}") as r:
                await r.read()

        out["aiohttp plain GET (HTTPS)"] = await _measure(n, inflight, plain)
    out["S3Store (lean)"] = await _measure_store(S3Store("b", endpoint_url=endpoint), n, inflight)
    store = S3Store("b", endpoint_url=tls_endpoint, ca_bundle=ca_file)
    out["S3Store (lean, HTTPS)"] = await _measure_store(store, n, inflight)
    return out


def tls_floor(size: int, n: int) -> float:
    """CPU per ``size``-byte answer of TLS alone: its records written to the client's
    incoming BIO and decrypted into one buffer (a server encrypted them beforehand)."""
    import ssl

    import trustme

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # the handshake, both ways over the BIOs
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    body = os.urandom(size)
    records = []
    for _ in range(n):
        server.write(body)
        records.append(s_out.read())
    buf = bytearray(size)
    view = memoryview(buf)
    c0 = time.process_time()
    for data in records:
        c_in.write(data)
        got = 0
        while got < size:
            got += client.read(size - got, view[got:])
    return (time.process_time() - c0) / n


async def _measure_store(store: ObjectStore, n: int, inflight: int) -> float:
    try:
        objs = [o async for o in store.list()]

        def ours(i: int, objs: list[ObjectInfo] = objs) -> Awaitable[Blob]:
            return store.get(objs[i % len(objs)].key, etag=objs[i % len(objs)].etag)

        return await _measure(n, inflight, ours)
    finally:
        await store.close()


async def run_azure(az: Azurite, keys: list[str], n: int, inflight: int) -> dict[str, float]:
    import aiohttp
    from azure.storage.blob.aio import BlobServiceClient

    out: dict[str, float] = {}
    k = len(keys)
    async with BlobServiceClient.from_connection_string(
        az.connection_string, api_version="2024-11-04"
    ) as service:
        container = service.get_container_client("bench")

        async def sdk(i: int) -> None:
            stream = await container.download_blob(keys[i % k])
            await stream.readall()

        out["azure-storage-blob aio download_blob"] = await _measure(n, inflight, sdk)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight)) as http:

        async def plain(i: int) -> None:
            async with http.get(f"{az.endpoint}/bench/{keys[i % k]}") as r:
                await r.read()

        out["aiohttp plain GET (anonymous)"] = await _measure(n, inflight, plain)
    for name, http_client in (("AzureStore (aiohttp)", "aiohttp"), ("AzureStore (lean)", "lean")):
        store = AzureStore(
            "bench",
            account=az.account,
            account_key=az.key,
            endpoint_url=az.endpoint,
            http_client=http_client,
        )
        out[name] = await _measure_store(store, n, inflight)
    return out


async def run_gcs(
    gcs: GCSEmulator, key_file: str, keys: list[str], n: int, inflight: int
) -> dict[str, float]:
    import aiohttp

    out: dict[str, float] = {}
    k = len(keys)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight)) as http:

        async def plain(i: int) -> None:
            url = f"{gcs.endpoint}/download/storage/v1/b/bench/o/{keys[i % k]}?alt=media"
            async with http.get(url) as r:
                await r.read()

        out["aiohttp plain GET (anonymous)"] = await _measure(n, inflight, plain)
    for name, http_client in (("(aiohttp, bearer)", "aiohttp"), ("(lean, bearer)", "lean")):
        store = GCSStore(
            "bench", endpoint_url=gcs.endpoint, credentials_file=key_file, http_client=http_client
        )
        out[f"GCSStore {name}"] = await _measure_store(store, n, inflight)
    store = GCSStore("bench", endpoint_url=gcs.endpoint, anonymous=True)
    out["GCSStore (lean, anonymous)"] = await _measure_store(store, n, inflight)
    return out


def _report(
    title: str, runs: list[dict[str, float]], floor_name: str, what: str = "x plain aiohttp"
) -> None:
    print(f"\n{title}, median of {len(runs)}")
    print(f"{'path':40s} {'ms/GET':>8s} {what:>16s}")
    for name in runs[0]:
        med = statistics.median(r[name] for r in runs)
        ratio = statistics.median(r[name] / r[floor_name] for r in runs)
        print(f"{name:40s} {med * 1e3:8.3f} {ratio:16.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--inflight", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--data-dir", default=os.path.join("cache", "bench-jpegs"))
    p.add_argument("--store", choices=("s3", "azure", "gcs", "all"), default="all")
    args = p.parse_args()
    from asyncloader.testing._demo import make_jpeg_folder

    os.environ.update({k: os.environ.get(k, v) for k, v in TEST_ENV.items()})
    folder = make_jpeg_folder(args.data_dir, images=1000, classes=10, seed=0)
    what = f"client CPU per GET, ~110 KB objects, {args.inflight} in flight"
    if args.store in ("s3", "all"):
        runs: list[dict[str, float]] = []
        tls_runs: list[dict[str, float]] = []
        with (
            S3TestServer(load=folder, bucket="b") as srv,
            S3TestServer(load=folder, bucket="b", tls=True) as tls,
            TokenServer() as tokens,
            tempfile.TemporaryDirectory() as tmp,
        ):
            key_file = str(tokens.google_service_account(os.path.join(tmp, "sa.json")))
            keys = [k for k in srv.stats()["keys"] if k.endswith(".jpg")]
            size = int(statistics.median(p.stat().st_size for p in folder.rglob("*.jpg")))
            pair = (srv.endpoint, tls.endpoint, tls.ca_file, keys, args.requests, args.inflight)
            for _ in range(args.repeat):
                runs.append(
                    asyncio.run(run(srv.endpoint, keys, args.requests, args.inflight, key_file))
                )
                row = asyncio.run(run_tls(*pair))
                try:
                    import uvloop
                except ImportError:
                    pass
                else:
                    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                        fast = runner.run(run_tls(*pair))
                    for name in ("S3Store (lean)", "S3Store (lean, HTTPS)"):
                        row[f"{name[:-1]}, uvloop)"] = fast[name]
                row["TLS floor: decrypt only"] = tls_floor(size, args.requests)
                tls_runs.append(row)
        _report(f"S3: {what}", runs, "aiohttp plain GET (unsigned)")
        _report(f"S3 over HTTPS: {what}", tls_runs, "S3Store (lean)", "x lean HTTP")
        floor = statistics.median(
            1 + r["TLS floor: decrypt only"] / r["S3Store (lean)"] for r in tls_runs
        )
        print(f"HTTPS with nothing but its decryption on top of lean HTTP: {floor:.2f} x")
    if args.store in ("azure", "all"):
        runs = []
        with Azurite() as az:
            az.create_bucket("bench", public=True)
            files = sorted(p for p in folder.rglob("*.jpg"))
            az.upload_folder("bench", folder)
            keys = [p.relative_to(folder).as_posix() for p in files]
            for _ in range(args.repeat):
                runs.append(asyncio.run(run_azure(az, keys, args.requests, args.inflight)))
        _report(f"Azure: {what}", runs, "aiohttp plain GET (anonymous)")
    if args.store in ("gcs", "all"):
        from urllib.parse import quote

        runs = []
        with GCSEmulator() as gcs, TokenServer() as tokens, tempfile.TemporaryDirectory() as tmp:
            gcs.create_bucket("bench")
            gcs.upload_folder("bench", folder)
            key_file = str(tokens.google_service_account(os.path.join(tmp, "sa.json")))
            keys = [quote(p.relative_to(folder).as_posix(), safe="") for p in folder.rglob("*.jpg")]
            for _ in range(args.repeat):
                runs.append(asyncio.run(run_gcs(gcs, key_file, keys, args.requests, args.inflight)))
        _report(f"GCS: {what}", runs, "aiohttp plain GET (anonymous)")


if __name__ == "__main__":
    main()
