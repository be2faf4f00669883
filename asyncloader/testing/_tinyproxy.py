"""tinyproxy, a forward proxy nobody here wrote, on 127.0.0.1: plain-HTTP requests forwarded,
HTTPS through the tunnel a ``CONNECT`` opens (the way a company's proxy passes a loader's
requests to S3 or a CDN), optionally behind Basic credentials and with ``CONNECT`` allowed
to some ports only (as squid's ``SSL_ports`` allows 443 alone), every request it was asked
read back from its log."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._gcs import _die_with_parent
from ._servers import _Subprocess, free_port

__all__ = ["TinyProxy", "find_tinyproxy"]

# A request as tinyproxy logs it: "Request (file descriptor 5): CONNECT host:443 HTTP/1.1".
_REQUEST = re.compile(r"Request \(file descriptor \d+\): (\S+) (\S+) HTTP/")


def find_tinyproxy() -> str | None:
    """The ``tinyproxy`` executable: ``$TINYPROXY``, or one on PATH (``apt-get install
    tinyproxy-bin``; ``.ci/run`` installs it); None when there is none."""
    return os.environ.get("TINYPROXY") or shutil.which("tinyproxy")


class TinyProxy(_Subprocess):
    """tinyproxy listening on 127.0.0.1 (one process in the foreground: it runs as the user
    who starts it, and stops with it).

    Args:
        credentials: ``(user, password)`` it asks of every request (Basic, 407 without).
        connect_ports: The ports a ``CONNECT`` may open a tunnel to (403 to any other);
            None: every port.
        max_clients: Its ``MaxClients``: connections it serves at once (it leaves the next
            in its listen queue, unanswered, until one of them closes).

    ``endpoint`` is ``http://127.0.0.1:PORT`` (:meth:`url` with the credentials in it);
    :meth:`requests` reads what it was asked from its log.
    """

    def __init__(
        self,
        *,
        credentials: tuple[str, str] | None = None,
        connect_ports: Sequence[int] | None = None,
        max_clients: int = 256,
    ) -> None:
        super().__init__()
        self.login = credentials
        self.connect_ports = connect_ports
        self.max_clients = max_clients
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._log = ""  # the log, kept when it stops

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """The proxy's URL with credentials in it: ``user`` and ``password``, else its own."""
        given = self.login or ("", "")
        user = given[0] if user is None else user
        password = given[1] if password is None else password
        return self.endpoint.replace("http://", f"http://{user}:{password}@", 1)

    def start(self) -> None:
        exe = find_tinyproxy()
        if exe is None:
            raise FileNotFoundError(
                "tinyproxy not found: apt-get install tinyproxy-bin (Debian), or set TINYPROXY"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="asyncloader-tinyproxy-")
        work = Path(self._dir.name)
        port = free_port()
        lines = [
            f"Port {port}",
            "Listen 127.0.0.1",
            "Timeout 60",
            f"MaxClients {self.max_clients}",
            "LogLevel Info",
            f'LogFile "{work / "tinyproxy.log"}"',
        ]
        if self.login is not None:
            lines.append("BasicAuth {} {}".format(*self.login))
        lines += [f"ConnectPort {p}" for p in self.connect_ports or ()]
        config = work / "tinyproxy.conf"
        config.write_text("\n".join(lines) + "\n")
        self.endpoint = f"http://127.0.0.1:{port}"
        self._proc = subprocess.Popen(
            [exe, "-d", "-c", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self._wait_ready(
            lambda: socket.create_connection(("127.0.0.1", port), 1).close(), 30, "tinyproxy"
        )

    def _text(self) -> str:
        if self._dir is None:
            return self._log
        log = Path(self._dir.name) / "tinyproxy.log"
        return log.read_text(errors="replace") if log.exists() else ""

    def requests(self) -> list[tuple[str, str]]:
        """Every request it was asked so far, in order: the method (``CONNECT`` for a
        tunnel) and its target (``host:port`` for a tunnel, the URL for a plain one)."""
        return [(m[1], m[2]) for m in _REQUEST.finditer(self._text())]

    def stop(self) -> None:
        super().stop()
        work, self._dir = self._dir, None
        if work is not None:
            log = Path(work.name) / "tinyproxy.log"
            self._log = log.read_text(errors="replace") if log.exists() else ""
            work.cleanup()
