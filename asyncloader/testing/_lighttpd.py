"""lighttpd, a second web server nobody here wrote, on 127.0.0.1: a folder served with its
folder pages on (``mod_dirlisting``: a table of links with rounded sizes, the way Apache's
and most small servers write them) in the configuration a test asks for, every answer
written to an access log the test reads back (the method, the path as sent, the status,
the body bytes, the Range asked).

The files' types are named as Debian's configuration names them (from
``/etc/mime.types``) for the image formats the loader reads: lighttpd sends neither an
``ETag`` nor a ``Last-Modified`` for a file of no known type."""

from __future__ import annotations

import os
import shutil

from ._servers import free_port
from ._webserver import Answer, WebServer, read_answers

__all__ = ["Lighttpd", "find_lighttpd"]


def find_lighttpd() -> str | None:
    """The ``lighttpd`` executable: ``$LIGHTTPD``, one on PATH, or Debian's
    ``/usr/sbin/lighttpd`` (``apt-get install lighttpd``; ``.ci/run`` installs it); None
    when there is none."""
    exe = os.environ.get("LIGHTTPD") or shutil.which("lighttpd")
    if exe:
        return exe
    return "/usr/sbin/lighttpd" if os.access("/usr/sbin/lighttpd", os.X_OK) else None


def _quoted(text: str) -> str:
    """A string as lighttpd's configuration writes one."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Lighttpd(WebServer):
    """lighttpd serving ``root`` on 127.0.0.1, folder pages on (one process in the
    foreground: it runs as the user who starts it, and stops with it).

    Args:
        root: The folder served at ``/``.
        config: More of lighttpd's configuration, as it reads it (``'server.max-keep-alive
            -requests = 4'``, ``'dir-listing.activate = "disable"'``, ...).

    ``endpoint`` is ``http://127.0.0.1:PORT``.  :meth:`answers` reads the access log,
    which lighttpd writes out about once a second and when it stops: read it once the
    server has stopped (the answers stay readable then) for every answer.
    """

    def __init__(self, root: str | os.PathLike[str], *, config: str = "") -> None:
        super().__init__(root)
        self.config = config

    def start(self) -> None:
        exe = find_lighttpd()
        if exe is None:
            raise FileNotFoundError(
                "lighttpd not found: apt-get install lighttpd (Debian), or set LIGHTTPD"
            )
        work = self._work_folder("lighttpd")
        port = free_port()
        config = work / "lighttpd.conf"
        access = r'%m %U %s %b "%{Range}i"'
        config.write_text(
            f"""
server.document-root = {_quoted(str(self.root))}
server.bind = "127.0.0.1"
server.port = {port}
server.pid-file = {_quoted(str(work / "lighttpd.pid"))}
server.errorlog = {_quoted(str(work / "error.log"))}
server.upload-dirs = ({_quoted(str(work))})
server.modules = ("mod_accesslog", "mod_dirlisting")
dir-listing.activate = "enable"
accesslog.filename = {_quoted(str(work / "access.log"))}
accesslog.format = {_quoted(access)}
mimetype.assign = (
    ".jpg" => "image/jpeg", ".jpeg" => "image/jpeg", ".png" => "image/png",
    ".webp" => "image/webp", ".bmp" => "image/bmp", ".gif" => "image/gif",
    ".tif" => "image/tiff", ".tiff" => "image/tiff", ".ppm" => "image/x-portable-pixmap",
    ".txt" => "text/plain", ".json" => "application/json", ".jsonl" => "text/plain",
)
{self.config}
"""
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        self._launch([exe, "-D", "-f", str(config)], port, "lighttpd")

    def answers(self) -> list[Answer]:
        """Every answer the access log holds, in order: all of them once the server has
        stopped (while it runs, those of up to a second ago)."""
        return read_answers(self._access_log())
