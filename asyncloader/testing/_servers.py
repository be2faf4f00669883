"""Local servers for tests, benchmarks and the demo, each a subprocess on 127.0.0.1.

* :class:`S3TestServer` — our light in-memory S3-compatible server (``_s3server``) with
  injected latency and faults; cheap enough to benchmark against.
* :class:`MotoServer` — ``moto_server``, the reference S3 emulator.
* :class:`Azurite` (``_azurite``) — Microsoft's Blob emulator from npm.

Each is a context manager that starts the subprocess and stops it on exit (and the
subprocess stops by itself when its parent dies).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._equipment import Equipment

__all__ = ["TEST_ENV", "MotoServer", "S3TestServer", "free_port"]

# Credentials that local emulators accept; never real ones.
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(
    method: str,
    url: str,
    body: bytes | None = None,
    timeout: float = 30.0,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> bytes:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        data: bytes = resp.read()
        return data


class _Subprocess(Equipment):
    endpoint: str

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        self.ca_file = ""
        self._tls_dir: tempfile.TemporaryDirectory[str] | None = None
        self._context: ssl.SSLContext | None = None

    def _certificate(self) -> Path:
        """Make a CA for this server (``trustme``) and a certificate for 127.0.0.1 from it;
        ``ca_file`` is the CA's PEM file, for clients to trust.  Returns the folder with
        ``cert.pem``, ``key.pem`` and both in ``server.pem``."""
        import trustme

        self._tls_dir = tempfile.TemporaryDirectory(prefix="asyncloader-tls-")
        folder = Path(self._tls_dir.name)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file = str(folder / "ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        cert.private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
        cert.private_key_pem.write_to_path(str(folder / "key.pem"))
        for i, pem in enumerate(cert.cert_chain_pems):
            pem.write_to_path(str(folder / "cert.pem"), append=i > 0)
        self._context = ssl.create_default_context(cafile=self.ca_file)
        return folder

    def _wait_ready(self, probe: Callable[[], object], seconds: float, what: str) -> None:
        """Call ``probe`` until it stops raising OSError: the server answers.  Stop it and
        raise if it exits or stays silent for ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                probe()
                return
            except OSError:
                proc = self._proc
                if proc is None or proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{what} did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server: terminate, then kill if it does not go within 5 s."""
        proc, self._proc = self._proc, None
        client, self._client = self._client, None
        if client is not None:
            client.close()
        tls, self._tls_dir = self._tls_dir, None
        if tls is not None:
            tls.cleanup()  # the running server has its files open already
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin:
                proc.stdin.close()
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def credentials(self) -> dict[str, str]:
        """The environment a client of this server needs (``TEST_ENV``)."""
        return dict(TEST_ENV)

    def client(self) -> Any:
        """A plain (sync) botocore S3 client for this server, with :meth:`credentials`.

        botocore clients are thread-safe, so one client can upload from a thread pool.
        """
        if self._client is None:
            import botocore.session
            from botocore.config import Config

            creds = self.credentials()
            self._client = botocore.session.get_session().create_client(
                "s3",
                endpoint_url=self.endpoint,
                verify=getattr(self, "ca_file", "") or None,
                region_name=TEST_ENV["AWS_DEFAULT_REGION"],
                aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
                config=Config(
                    max_pool_connections=16,
                    s3={"addressing_style": "path"},
                    retries={"max_attempts": 10},
                    # No aws-chunked bodies with checksum trailers (botocore's HTTPS default):
                    # the light server reads plain Content-Length bodies.
                    request_checksum_calculation="when_required",
                ),
            )
        return self._client

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def delete(self, bucket: str, key: str) -> None:
        self.client().delete_object(Bucket=bucket, Key=key)

    def upload_folder(
        self, bucket: str, folder: str | os.PathLike[str], prefix: str = "", threads: int = 8
    ) -> int:
        """Upload every file below ``folder`` as ``prefix + relative path``; returns count."""
        root = Path(folder)
        files = [p for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")]
        with ThreadPoolExecutor(threads) as ex:
            list(
                ex.map(
                    lambda p: self.put(
                        bucket, prefix + p.relative_to(root).as_posix(), p.read_bytes()
                    ),
                    files,
                )
            )
        return len(files)


class S3TestServer(_Subprocess):
    """Our light S3-compatible server (see :mod:`asyncloader.testing._s3server`).

    Args:
        latency: Time to first byte of every response [seconds].
        load: A folder loaded into ``bucket`` at start (fast: no HTTP).
        bucket: Bucket created at start.
        prefix: Key prefix for the loaded folder.
        tls: Serve HTTPS with a certificate for 127.0.0.1 from a CA made for this server
            (``trustme``); ``ca_file`` is that CA's PEM file, for clients to trust
            (``AWS_CA_BUNDLE``, ``ca_bundle=``).
        synthetic: Serve this many keys in ``bucket`` under ``prefix`` that all hold one
            small JPEG (``synthetic_body``, a file; default 64×48): a million keys cost
            the server their names, not their bodies.  Keys are
            ``class_FFFF/img_NNNNNNN.jpg`` in ``synthetic_folders`` folders, or
            ``img_NNNNNNN.jpg`` with none.
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        load: str | os.PathLike[str] | None = None,
        bucket: str = "",
        prefix: str = "",
        tls: bool = False,
        synthetic: int = 0,
        synthetic_folders: int = 0,
        synthetic_body: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        self.latency = latency
        self.load = load
        self.bucket = bucket
        self.prefix = prefix
        self.tls = tls
        self.synthetic = (synthetic, synthetic_folders, synthetic_body)

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "asyncloader.testing._s3server",
            "--latency",
            str(self.latency),
        ]
        if self.bucket:
            cmd += ["--bucket", self.bucket, "--prefix", self.prefix]
        if self.load:
            cmd += ["--load", str(self.load)]
        count, folders, body = self.synthetic
        if count:
            cmd += ["--synthetic", str(count), "--synthetic-folders", str(folders)]
            cmd += ["--synthetic-body", str(body)] if body else []
        if self.tls:
            cmd += ["--tls-cert", str(self._certificate() / "server.pem")]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self._proc = proc
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"test S3 server did not start: {line!r}")
        scheme = "https" if self.tls else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{int(line.split()[1])}"

    def set_faults(
        self,
        rates: dict[str, float] | None = None,
        *,
        max_faults_per_key: int = 3,
        seed: int = 0,
        stall_seconds: float = 30.0,
        latency: float | None = None,
        rate_limit: float | None = None,
        burst: float | None = None,
    ) -> None:
        """Inject faults: ``rates`` maps a kind of FAULT_KINDS to its probability per GET;
        ``latency`` (time to first byte [seconds]) and ``rate_limit`` (object requests per
        second above which the server answers 503 SlowDown, a token bucket of ``burst``;
        0: none) change only when given."""
        cfg: dict[str, Any] = {
            "rates": rates or {},
            "max_faults_per_key": max_faults_per_key,
            "seed": seed,
            "stall_seconds": stall_seconds,
        }
        if latency is not None:
            cfg["latency"] = latency
        if rate_limit is not None:
            cfg["rate_limit"] = rate_limit
        if burst is not None:
            cfg["burst"] = burst
        _http(
            "POST",
            f"{self.endpoint}/_control/faults",
            json.dumps(cfg).encode(),
            context=self._context,
        )

    def set_region(self, bucket: str, region: str, *, answer: str = "redirect") -> None:
        """Put ``bucket`` in ``region``: requests signed for another are answered as S3
        answers them, ``answer="redirect"`` (301 PermanentRedirect) or ``"malformed"``
        (400 AuthorizationHeaderMalformed naming the region); counted as ``wrong_region``."""
        self._bucket_control({"bucket": bucket, "region": region, "answer": answer})

    def set_requester_pays(self, bucket: str) -> None:
        """Make ``bucket`` requester-pays: requests without ``x-amz-request-payer:
        requester`` are refused (403 AccessDenied), counted as ``payer_refused``."""
        self._bucket_control({"bucket": bucket, "requester_pays": True})

    def _bucket_control(self, cfg: dict[str, Any]) -> None:
        body = json.dumps(cfg).encode()
        _http("POST", f"{self.endpoint}/_control/bucket", body, context=self._context)

    def stats(self) -> dict[str, Any]:
        """Request counters: ``counters`` (get, head, list, fault_*), ``gets_by_key`` and
        ``ranges_by_key`` (the GETs of a byte range)."""
        out: dict[str, Any] = json.loads(
            _http("GET", f"{self.endpoint}/_control/stats", context=self._context)
        )
        return out

    def reset_stats(self) -> None:
        _http("POST", f"{self.endpoint}/_control/reset-stats", b"", context=self._context)


class MotoServer(_Subprocess):
    """``moto_server`` on 127.0.0.1 as a subprocess (needs ``pip install 'moto[server]'``).

    Args:
        check_credentials: Make moto check every request as AWS does: the access key must
            be one its IAM knows, the SigV4 signature must be the one that key's secret
            makes of the request (method, path, query, signed headers, body hash), and the
            key's user must be allowed the action.  The server makes one IAM user allowed
            every S3 action and an access key for it (:attr:`access_key_id`,
            :attr:`secret_access_key`) before the checks start; its own :meth:`client`
            signs with that key, and clients must too (``TEST_ENV``'s key is refused).
    """

    access_key_id = ""
    """With ``check_credentials``: the access key moto knows (else empty)."""
    secret_access_key = ""
    """With ``check_credentials``: that key's secret (else empty)."""

    def __init__(self, *, check_credentials: bool = False) -> None:
        super().__init__()
        self.check_credentials = check_credentials

    def credentials(self) -> dict[str, str]:
        """The environment a client of this server needs: ``TEST_ENV``, with the server's
        own access key where it checks credentials."""
        if not self.check_credentials:
            return dict(TEST_ENV)
        return {
            **TEST_ENV,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }

    def _make_access_key(self) -> None:
        """One IAM user allowed ``s3:*`` and an access key for it, then every later request
        checked (moto's ``/moto-api/reset-auth``: no more unchecked requests)."""
        import botocore.session

        iam = botocore.session.get_session().create_client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=TEST_ENV["AWS_DEFAULT_REGION"],
            aws_access_key_id=TEST_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=TEST_ENV["AWS_SECRET_ACCESS_KEY"],
        )
        try:
            iam.create_user(UserName="asyncloader")
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
            }
            iam.put_user_policy(
                UserName="asyncloader", PolicyName="s3", PolicyDocument=json.dumps(policy)
            )
            key = iam.create_access_key(UserName="asyncloader")["AccessKey"]
        finally:
            iam.close()
        self.access_key_id = key["AccessKeyId"]
        self.secret_access_key = key["SecretAccessKey"]
        # The body read as text, not as a form.
        plain = {"Content-Type": "text/plain"}
        _http("POST", f"{self.endpoint}/moto-api/reset-auth", b"0", headers=plain)

    def start(self) -> None:
        exe = shutil.which("moto_server")
        cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
        port = free_port()
        env = {**os.environ, **TEST_ENV}
        proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self._proc = proc
        self.endpoint = f"http://127.0.0.1:{port}"
        self._wait_ready(
            lambda: _http("GET", f"{self.endpoint}/moto-api/", timeout=2), 30, "moto_server"
        )
        if self.check_credentials:
            try:
                self._make_access_key()
            except BaseException:
                self.stop()
                raise
