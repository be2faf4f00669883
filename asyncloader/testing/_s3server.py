"""A light, in-memory, S3-compatible HTTP server: test equipment, not product.

moto costs ~2.5 ms of CPU per GET, too much to measure a loader with.  This server speaks the
small part of the S3 REST API a loader needs (path-style ListObjectsV2 with pagination and
delimiter, HEAD/GET with ``Range`` and ``If-Match``, PUT, bucket create) over a raw asyncio
protocol, at a few tens of microseconds of CPU per GET.  It does not check signatures (of
the ``Authorization`` header it reads only the region, for buckets put in one).  It
also answers GCS media downloads (``/download/storage/v1/b/BUCKET/o/NAME``) of the same
objects, so that the S3 and GCS clients can be compared on one server.

It injects, per request to an object:

* time-to-first-byte latency (``latency`` seconds, every response),
* faults with a seeded probability, each key failing at most ``max_faults_per_key`` times so
  a retrying client always gets through: ``slowdown`` (503 SlowDown), ``throttle`` (429),
  ``error`` (500), ``reset`` (connection aborted without an answer), ``truncate`` (headers
  announce the full length, half the body is sent, then the connection is closed),
  ``stall`` (the answer is held back ``stall_seconds``) and ``short`` (a complete answer
  whose Content-Length and body are cut to half, as a middlebox that rewrote the length
  sends it; listing pages get this one too) and ``stall_body`` (headers and half the body
  are sent, the rest ``stall_seconds`` later).

A bucket can be put in a region (``POST /_control/bucket``): a request signed for another
region is answered as S3 answers it — ``301 PermanentRedirect`` (``answer="redirect"``, what
an endpoint of the wrong region says) or ``400 AuthorizationHeaderMalformed`` naming the
``<Region>`` (``answer="malformed"``), with ``x-amz-bucket-region`` either way and no body to
a HEAD.  Only the credential scope of the ``Authorization`` header is read.  A bucket can
also be requester-pays: a request without ``x-amz-request-payer: requester`` is refused
(403 AccessDenied), as S3 refuses it.

A bucket can also be synthetic (``--synthetic N``): N keys over one body, with sizes and
ETags, for listing a million keys without holding a million bodies.

Control endpoints (plain JSON): ``POST /_control/faults`` sets the fault rates,
``GET /_control/stats`` returns request counters, ``POST /_control/reset-stats``.

Run: ``python -m asyncloader.testing._s3server --port 0 [--latency 0.02] [--load DIR
--bucket NAME] [--tls-cert PEM]``; it prints ``READY <port>`` once listening, and serves
HTTPS when given a certificate (``S3TestServer(tls=True)`` makes one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import ssl
import sys
from email.utils import formatdate
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from ._s3answers import control, error_xml, list_page
from ._s3state import ServerState, load_folder, synthetic_bucket

_SCOPE = re.compile(r"Credential=[^/,]+/[0-9]{8}/([^/,]+)/")


_REASONS = {
    200: "OK",
    204: "No Content",
    206: "Partial Content",
    304: "Not Modified",
    404: "Not Found",
    412: "Precondition Failed",
    416: "Range Not Satisfiable",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


_GCS_MEDIA = "/download/storage/v1/b/"


class _Protocol(asyncio.Protocol):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.continued = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._maybe_handle()

    def _maybe_handle(self) -> None:
        if self.busy or self.transport is None:
            return
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ", 2)
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self.buf) < head_end + 4 + length:
            if headers.pop("expect", "").lower() == "100-continue" and not self.continued:
                # botocore waits a second for this before sending a PUT's body.
                self.continued = True
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        self.continued = False
        body = self.buf[head_end + 4 : head_end + 4 + length]
        self.buf = self.buf[head_end + 4 + length :]
        self.busy = True
        self._handle(method, target, headers, body)

    def _respond(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        head: bool = False,
        fault: str | None = None,
    ) -> None:
        def send() -> None:
            t = self.transport
            if t is None or t.is_closing():
                return
            if fault == "reset":
                t.abort()
                return
            # "short": a complete answer cut to half, its Content-Length rewritten to match.
            payload = body[: len(body) // 2] if fault == "short" else body
            hdrs = {"Content-Length": str(len(payload)), "Date": formatdate(usegmt=True)}
            hdrs.update(headers or {})
            lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'X')}"]
            lines += [f"{k}: {v}" for k, v in hdrs.items()]
            out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            if fault == "truncate":
                t.write(out + body[: len(body) // 2])
                t.close()
                return
            if fault == "stall_body" and not head:
                half = len(body) // 2
                t.write(out + body[:half])

                def rest() -> None:
                    if not t.is_closing():
                        t.write(body[half:])
                        self.busy = False
                        self._maybe_handle()

                asyncio.get_running_loop().call_later(self.state.stall_seconds, rest)
                return
            t.write(out if head else out + payload)
            self.busy = False
            self._maybe_handle()

        delay = self.state.latency + (self.state.stall_seconds if fault == "stall" else 0.0)
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, send)
        else:
            send()

    def _handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        st = self.state
        st.counters["requests"] += 1
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if path.startswith("/_control/"):
            self._respond(*control(self.state, method, path, body))
            return
        if path.startswith(_GCS_MEDIA) and method == "GET":
            # A GCS media download of the same object (to compare clients on one server).
            bucket, _, key = path[len(_GCS_MEDIA) :].partition("/o/")
            if not key:
                self._respond(404, error_xml("NoSuchKey", path))
                return
        else:
            bucket, _, key = path.lstrip("/").partition("/")
        if self._wrong_region(bucket, method, headers):
            return
        if bucket in st.requester_pays and headers.get("x-amz-request-payer") != "requester":
            st.counters["payer_refused"] += 1
            self._respond(403, error_xml("AccessDenied", "Access Denied"), head=method == "HEAD")
            return
        objects = st.buckets.get(bucket)
        if not key:
            if method == "PUT":
                st.buckets.setdefault(bucket, {})
                self._respond(200)
            elif objects is None:
                self._respond(404, error_xml("NoSuchBucket", bucket))
            elif method == "HEAD":
                region = st.regions.get(bucket, "us-east-1")
                self._respond(200, headers={"x-amz-bucket-region": region}, head=True)
            else:
                st.counters["list"] += 1
                fault = st.pick_fault(f"list?{parts.query}", kinds=("short",))
                self._respond(200, list_page(self.state, bucket, objects, query), fault=fault)
            return
        if objects is None:
            self._respond(404, error_xml("NoSuchBucket", bucket))
            return
        if method == "PUT":
            etag = st.put(bucket, key, body)
            self._respond(200, headers={"ETag": f'"{etag}"'})
            return
        if method == "DELETE":
            st.delete(bucket, key)
            self._respond(204)
            return
        st.counters["get" if method == "GET" else "head"] += 1
        if method == "GET":
            st.gets_by_key[key] += 1
            if "range" in headers:
                st.ranges_by_key[key] += 1
        if not st.admit(asyncio.get_running_loop().time()):
            st.counters["rate_limited"] += 1
            self._respond(503, error_xml("SlowDown", "rate limit"), head=method == "HEAD")
            return
        fault = st.pick_fault(key)
        if fault in ("slowdown", "throttle", "error"):
            status, code = {
                "slowdown": (503, "SlowDown"),
                "throttle": (429, "TooManyRequests"),
                "error": (500, "InternalError"),
            }[fault]
            self._respond(status, error_xml(code, "injected"), head=method == "HEAD")
            return
        obj = objects.get(key)
        if obj is None:
            self._respond(404, error_xml("NoSuchKey", key), head=method == "HEAD")
            return
        if_match = headers.get("if-match", "").strip('"')
        if if_match and if_match != obj.etag:
            self._respond(412, error_xml("PreconditionFailed", key), head=method == "HEAD")
            return
        data = obj.data
        status = 200
        extra = {"ETag": f'"{obj.etag}"', "Last-Modified": formatdate(0, usegmt=True)}
        rng = headers.get("range")
        if rng and rng.startswith("bytes="):
            first_s, _, last_s = rng[6:].partition("-")
            first = int(first_s)
            last = min(int(last_s), len(data) - 1) if last_s else len(data) - 1
            if first >= len(data):
                self._respond(416, error_xml("InvalidRange", key))
                return
            extra["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            data = data[first : last + 1]
            status = 206
        if method == "HEAD":
            self._respond(status, data, extra, head=True)
            return
        self._respond(status, data, extra, fault=fault)

    def _wrong_region(self, bucket: str, method: str, headers: dict[str, str]) -> bool:
        """Answer, as S3 does, a request signed for another region than ``bucket``'s."""
        st = self.state
        region = st.regions.get(bucket)
        m = _SCOPE.search(headers.get("authorization", ""))
        if region is None or m is None or m.group(1) == region:
            return False
        st.counters["wrong_region"] += 1
        extra = {"x-amz-bucket-region": region}
        if st.region_answer == "redirect":
            body = error_xml(
                "PermanentRedirect",
                "The bucket you are attempting to access must be addressed using the "
                "specified endpoint. Please send all future requests to this endpoint.",
            ).replace(
                b"</Error>",
                f"<Endpoint>{bucket}.s3.{region}.amazonaws.com</Endpoint>"
                f"<Bucket>{bucket}</Bucket></Error>".encode(),
            )
            self._respond(301, body, extra, head=method == "HEAD")
        else:
            body = error_xml(
                "AuthorizationHeaderMalformed",
                f"The authorization header is malformed; the region '{m.group(1)}' is wrong; "
                f"expecting '{region}'",
            ).replace(b"</Error>", f"<Region>{region}</Region></Error>".encode())
            self._respond(400, body, extra, head=method == "HEAD")
        return True


async def _serve(args: argparse.Namespace) -> None:
    state = ServerState(latency=args.latency)
    if args.bucket:
        state.buckets.setdefault(args.bucket, {})
    if args.load:
        load_folder(state, args.bucket, Path(args.load), args.prefix)
    if args.synthetic:
        state.buckets[args.bucket] = synthetic_bucket(args)
    loop = asyncio.get_running_loop()
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key or None)
    server = await loop.create_server(
        lambda: _Protocol(state), args.host, args.port, backlog=1024, ssl=tls
    )
    port = server.sockets[0].getsockname()[1]
    print(f"READY {port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Stop too when the parent goes away (our stdin is its pipe), so no server outlives a test.
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(0, 4096) else None)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency", type=float, default=0.0, help="time to first byte [s]")
    p.add_argument("--bucket", default="")
    p.add_argument("--prefix", default="")
    p.add_argument("--load", default="", help="folder to load into --bucket")
    p.add_argument("--synthetic", type=int, default=0, help="serve this many keys in --bucket")
    p.add_argument("--synthetic-folders", type=int, default=0, help="in as many folders")
    p.add_argument("--synthetic-body", default="", help="every key's bytes (a small JPEG)")
    p.add_argument("--tls-cert", default="", help="serve HTTPS with this PEM certificate")
    p.add_argument("--tls-key", default="", help="its private key (PEM), if not in the cert")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
