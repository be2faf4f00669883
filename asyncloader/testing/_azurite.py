"""Microsoft's Azurite Blob emulator (npm ``azurite``) as a subprocess on 127.0.0.1, with
a small Blob REST client of its own to create containers and upload (signed with our
SharedKey signer)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from .._stores._azure import API_VERSION as AZURE_API_VERSION
from .._stores._azure_auth import AZURITE_ACCOUNT, AZURITE_KEY, SharedKeySigner
from ._servers import _Subprocess, free_port

__all__ = ["Azurite", "find_azurite"]


def find_azurite() -> str | None:
    """The ``azurite-blob`` executable: ``$AZURITE_BLOB``, then PATH, then the copy that
    ``.ci/run`` installs under ``.ci/node/`` of the current or package directory."""
    exe = os.environ.get("AZURITE_BLOB") or shutil.which("azurite-blob")
    if exe:
        return exe
    rel = Path(".ci", "node", "node_modules", ".bin", "azurite-blob")
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / rel).exists():
            return str(root / rel)
    return None


class Azurite(_Subprocess):
    """Microsoft's Azurite Blob emulator (npm ``azurite``) on 127.0.0.1, in memory.

    ``endpoint`` is the Blob service URL (``http://127.0.0.1:PORT/devstoreaccount1``);
    ``account``/``key`` are the emulator's published development credentials, and
    ``connection_string`` joins them.  ``create_bucket``/``put``/``delete`` act on
    containers and blobs (Put Blob, SharedKey-signed), so ``upload_folder`` works as for S3.

    ``oauth=True``: Azurite's OAuth mode, which also accepts bearer tokens (Microsoft Entra
    ID; it checks their issuer, audience and lifetime, not their signature).  It needs
    HTTPS: the server gets a certificate from a CA made for it, ``ca_file`` (for clients'
    ``ca_bundle=``).
    """

    account = AZURITE_ACCOUNT
    key = AZURITE_KEY

    def __init__(self, *, oauth: bool = False) -> None:
        super().__init__()
        self.oauth = oauth

    def start(self) -> None:
        exe = find_azurite()
        if exe is None:
            raise FileNotFoundError(
                "azurite-blob not found: `npm install --prefix .ci/node azurite` "
                "(bash .ci/run does this) or set AZURITE_BLOB"
            )
        port = free_port()
        self._workdir = tempfile.mkdtemp(prefix="asyncloader-azurite-")
        args = [
            exe,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--inMemoryPersistence",
            "--silent",
            "--disableTelemetry",
        ]
        if self.oauth:
            tls = self._certificate()
            args += ["--oauth", "basic", "--cert", str(tls / "cert.pem")]
            args += ["--key", str(tls / "key.pem")]
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self._workdir,
        )
        self._proc = proc
        scheme = "https" if self.oauth else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{port}/{self.account}"
        self._wait_ready(
            lambda: socket.create_connection(("127.0.0.1", port), 1).close(), 60, "azurite"
        )

    def stop(self) -> None:
        super().stop()
        workdir = getattr(self, "_workdir", None)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};"
            f"AccountKey={self.key};BlobEndpoint={self.endpoint};"
        )

    def _send(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: bytes = b"",
        extra: dict[str, str] | None = None,
    ) -> None:
        headers = {
            "x-ms-date": formatdate(usegmt=True),
            "x-ms-version": AZURE_API_VERSION,
            "content-length": str(len(body)),
            **(extra or {}),
        }
        if body:
            headers["content-type"] = "application/octet-stream"
        base = urlsplit(self.endpoint)
        full = base.path + path
        SharedKeySigner(self.account, self.key).sign(method, full, query, headers)
        qs = urlencode(query, quote_via=quote)
        url = f"{base.scheme}://{base.netloc}{full}{'?' + qs if qs else ''}"
        req = urllib.request.Request(url, data=body or None, method=method, headers=headers)
        for attempt in range(5):
            try:
                with urllib.request.urlopen(req, timeout=30, context=self._context) as resp:
                    resp.read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code == 409 and method == "PUT" and query:  # container exists
                    return
                if exc.code < 500 or attempt == 4:
                    raise
            time.sleep(0.1 * 2**attempt)

    def create_bucket(self, bucket: str, *, public: bool = False) -> None:
        """Create a container (no error if it exists); ``public``: anonymous reads allowed,
        also where the container existed already (its access is set)."""
        extra = {"x-ms-blob-public-access": "container"} if public else {}
        self._send("PUT", "/" + quote(bucket), {"restype": "container"}, extra=extra)
        if public:  # Set Container ACL: a container made before, private, becomes public
            acl = {"restype": "container", "comp": "acl"}
            self._send("PUT", "/" + quote(bucket), acl, extra=extra)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Put Blob (block blob), replacing any blob of that name."""
        self._send(
            "PUT", f"/{quote(bucket)}/{quote(key)}", {}, data, {"x-ms-blob-type": "BlockBlob"}
        )

    def delete(self, bucket: str, key: str) -> None:
        self._send("DELETE", f"/{quote(bucket)}/{quote(key)}", {})
