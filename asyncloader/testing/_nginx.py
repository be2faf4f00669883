"""nginx, the web server as it is deployed in front of datasets, on 127.0.0.1: a folder
served over HTTP or HTTPS in the configuration a test asks for (``max_ranges 0``, ``gzip
on``, ``limit_req``, ``keepalive_requests``, ...), every answer written to an access log
the test can read back (status, body bytes sent, the request line)."""

from __future__ import annotations

import http.client
import os
import shutil
import urllib.error

from ._servers import _http, free_port
from ._webserver import Answer, WebServer, read_answers

__all__ = ["Answer", "Nginx", "find_nginx"]  # Answer: _webserver's, as nginx's answers are

SETTLE = "/.asyncloader-settle"  # answered 204, never among the answers: Nginx._settle


def find_nginx() -> str | None:
    """The ``nginx`` executable: ``$NGINX``, one on PATH, or Debian's ``/usr/sbin/nginx``
    (``apt-get install nginx-light``; ``.ci/run`` installs it); None when there is none."""
    exe = os.environ.get("NGINX") or shutil.which("nginx")
    if exe:
        return exe
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


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
        super().__init__(root)
        self.server = server
        self.http = http
        self.tls = tls

    def start(self) -> None:
        exe = find_nginx()
        if exe is None:
            raise FileNotFoundError(
                "nginx not found: apt-get install nginx-light (Debian), or set NGINX"
            )
        work = self._work_folder("nginx")
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
        location = {SETTLE} {{ access_log off; return 204; }}
        {self.server}
    }}
}}
"""
        )
        self.endpoint = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        argv = [exe, "-c", str(config), "-p", str(work), "-e", str(work / "error.log")]
        self._launch(argv, port, "nginx")

    def answers(self) -> list[Answer]:
        """Every answer a client has had so far, in order; once it has stopped, every
        answer it gave."""
        if self._dir is not None:
            self._settle()
        # (A server-wide ``return`` answers the marker before its location could say not
        # to log it.)
        return [a for a in read_answers(self._access_log()) if a.path != SETTLE]

    def _settle(self) -> None:
        """Return once every answer sent so far is in the access log.  nginx writes an
        answer's line after sending the answer, in the same turn of its event loop, so a
        client that reads the log at once may find its last answer's line not there yet.
        This one process (no master, one worker) handles one event at a time: once it has
        answered a request sent now (``SETTLE``, not logged itself), every earlier
        answer's line is written."""
        try:
            _http("GET", self.endpoint + SETTLE, context=self._context)
        except urllib.error.HTTPError:
            pass  # answered all the same (a server-wide ``limit_req`` or ``auth_basic``)
        except (http.client.RemoteDisconnected, ConnectionResetError):
            pass  # a server told to close connections unanswered (``return 444``) has read it
