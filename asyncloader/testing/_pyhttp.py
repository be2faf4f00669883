"""Python's own ``http.server`` on 127.0.0.1, serving a folder as ``python -m http.server``
does: HTTP/1.0 answers (a connection per request, closed after it), one thread per
connection, a listen queue of five.  Every request is logged on its stderr, read back by
:meth:`PythonHTTPServer.requests`."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote

from ._gcs import _die_with_parent
from ._servers import _Subprocess, free_port

__all__ = ["PythonHTTPServer"]

# 127.0.0.1 - - [27/Nov/2026 17:40:01] "GET /class_00/img_000000.jpg HTTP/1.1" 200 -
_LINE = re.compile(r'\] "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3}) ')


class PythonHTTPServer(_Subprocess):
    """``python -m http.server`` serving ``root`` on 127.0.0.1.

    ``endpoint`` is ``http://127.0.0.1:PORT``; :meth:`requests` reads what it logged.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(root).resolve()
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> None:
        port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="asyncloader-http-server-")
        with open(Path(self._dir.name) / "log", "wb") as log:  # the child keeps its own
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=_die_with_parent,
            )
        self.endpoint = f"http://127.0.0.1:{port}"
        self._wait_ready(
            lambda: socket.create_connection(("127.0.0.1", port), 1).close(), 30, "http.server"
        )

    def requests(self) -> list[tuple[str, str, int]]:
        """Every request answered so far, in order: (method, path unquoted, status)."""
        assert self._dir is not None, "http.server is not running"
        text = (Path(self._dir.name) / "log").read_text(errors="replace")
        return [(m["method"], unquote(m["path"]), int(m["status"])) for m in _LINE.finditer(text)]

    def stop(self) -> None:
        super().stop()
        work, self._dir = self._dir, None
        if work is not None:
            work.cleanup()
