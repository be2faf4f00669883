"""nginx, the web server as it is deployed in front of datasets, on 127.0.0.1: a folder
served over HTTP or HTTPS in the configuration a test asks for (``max_ranges 0``, ``gzip
on``, ``limit_req``, ``keepalive_requests``, ...), every answer written to an access log
the test can read back (status, body bytes sent, the request line)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ._gcs import _die_with_parent
from ._servers import _Subprocess, free_port

__all__ = ["Answer", "Nginx", "find_nginx"]


def find_nginx() -> str | None:
    """The ``nginx`` executable: ``$NGINX``, one on PATH, or Debian's ``/usr/sbin/nginx``
    (``apt-get install nginx-light``; ``.ci/run`` installs it); None when there is none."""
    exe = os.environ.get("NGINX") or shutil.which("nginx")
    if exe:
        return exe
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


@dataclass(frozen=True, slots=True)
class Answer:
    """One line of an access log: what the server (nginx, lighttpd) answered."""

    method: str
    path: str  # unquoted, without the query
    status: int
    body_bytes: int
    range: str  # the request's Range header ("" for none)


def read_answers(log: str) -> list[Answer]:
    """An access log's answers, in order: each line the method, the request's path as sent
    (percent-encoded: no spaces; a query is left out), the status, the body bytes (``-``:
    none) and the Range asked, quoted (``"-"``: none) — as the servers here write it."""
    out = []
    for line in log.splitlines():
        method, sent_uri, status, sent, rng = line.split(" ", 4)
        path = unquote(sent_uri.partition("?")[0])
        body = 0 if sent == "-" else int(sent)
        rng = rng.strip('"')
        out.append(Answer(method, path, int(status), body, "" if rng == "-" else rng))
    return out


class WebServer(_Subprocess):
    """A web server run as a subprocess on 127.0.0.1, whose error log is kept in ``_said``
    when it stops (the subclass reads it there)."""

    _said: str

    def _launch(self, argv: list[str], port: int, what: str) -> None:
        """Start ``argv`` (a server that listens on 127.0.0.1:``port``; it dies with this
        process) and wait until it answers; else stop it and raise with what its error log
        says."""
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        try:
            self._wait_ready(
                lambda: socket.create_connection(("127.0.0.1", port), 1).close(), 30, what
            )
        except RuntimeError:
            raise RuntimeError(f"{what} did not start: {self._said.strip()}") from None


class Nginx(WebServer):
    """nginx serving ``root`` on 127.0.0.1 (one process, no master: it runs as the user
    who starts it, and stops with it).

    Args:
        root: The folder served at ``/``.
        server: Directives for the ``server`` block, as nginx reads them: ``"max_ranges
            0;"`` (ranges ignored: every GET answered 200 with the whole file), ``"gzip on;
            gzip_types *; gzip_min_length 0;"``, ``"keepalive_requests 50;"``,
            ``"limit_req zone=one nodelay;"``, ...
        http: Directives for the ``http`` block (``"limit_req_zone $server_name
            zone=one:1m rate=150r/s;"``).
        tls: Serve HTTPS with a certificate for 127.0.0.1 from a CA made for this server;
            ``ca_file`` is that CA's PEM file, for clients to trust.

    ``endpoint`` is ``http(s)://127.0.0.1:PORT``; :meth:`answers` reads the access log.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, server: str = "", http: str = "", tls: bool = False
    ) -> None:
        super().__init__()
        self.root = Path(root).resolve()
        self.server = server
        self.http = http
        self.tls = tls
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._said = ""  # its error log, kept when it stops

    def start(self) -> None:
        exe = find_nginx()
        if exe is None:
            raise FileNotFoundError(
                "nginx not found: apt-get install nginx-light (Debian), or set NGINX"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="asyncloader-nginx-")
        work = Path(self._dir.name)
        port = free_port()
        listen = f"127.0.0.1:{port}"
        tls = ""
        if self.tls:
            folder = self._certificate()
            listen += " ssl"
            tls = (
                f"ssl_certificate {folder / 'cert.pem'}; ssl_certificate_key {folder / 'key.pem'};"
            )
        temp = " ".join(
            f"{name}_temp_path {work / name};"
            for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        config = work / "nginx.conf"
        config.write_text(
            f"""
daemon off;
master_process off;
worker_processes 1;
pid {work / "nginx.pid"};
error_log {work / "error.log"} warn;
events {{ worker_connections 1024; }}
http {{
    {temp}
    types {{ image/jpeg jpg jpeg; image/png png; text/plain txt; application/json json; }}
    default_type application/octet-stream;
    log_format answers '$request_method $request_uri $status $body_bytes_sent "$http_range"';
    access_log {work / "access.log"} answers;
    {self.http}
    server {{
        listen {listen};
        {tls}
        root {self.root};
        {self.server}
    }}
}}
"""
        )
        self.endpoint = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        argv = [exe, "-c", str(config), "-p", str(work), "-e", str(work / "error.log")]
        self._launch(argv, port, "nginx")

    def answers(self) -> list[Answer]:
        """Every answer so far, in order (nginx writes a line as each answer ends)."""
        assert self._dir is not None, "nginx is not running"
        log = Path(self._dir.name) / "access.log"
        return read_answers(log.read_text() if log.exists() else "")

    def stop(self) -> None:
        super().stop()
        work, self._dir = self._dir, None
        if work is not None:
            errors = Path(work.name) / "error.log"
            self._said = errors.read_text() if errors.exists() else ""
            work.cleanup()
