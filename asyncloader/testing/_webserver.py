"""What the web servers of the test kit (nginx, lighttpd, Caddy: ``_nginx``, ``_lighttpd``,
``_caddy``) share: a subprocess on 127.0.0.1 with a work folder of its own (its
configuration, logs and state), started and waited for the same way, its access and error
logs kept when it stops, and the answers its access log records."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ._gcs import _die_with_parent
from ._servers import _Subprocess

__all__ = ["Answer", "WebServer", "read_answers"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One line of an access log: what the server answered."""

    method: str
    path: str  # unquoted, without the query
    status: int
    body_bytes: int
    range: str  # the request's Range header ("" for none)


def read_answers(log: str) -> list[Answer]:
    """An access log's answers, in order: each line the method, the request's path as sent
    (percent-encoded: no spaces; a query is left out), the status, the body bytes (``-``:
    none) and the Range asked, quoted (``"-"``: none) — as nginx and lighttpd write it
    here."""
    out = []
    for line in log.splitlines():
        method, sent_uri, status, sent, rng = line.split(" ", 4)
        path = unquote(sent_uri.partition("?")[0])
        body = 0 if sent == "-" else int(sent)
        rng = rng.strip('"')
        out.append(Answer(method, path, int(status), body, "" if rng == "-" else rng))
    return out


class WebServer(_Subprocess):
    """A web server serving ``root``, run as a subprocess on 127.0.0.1 from a work folder of
    its own (``access.log`` and ``error.log`` there, read back even once it has stopped).

    ``served`` is the folder it serves files from while it runs: ``root``, or the copy of
    it a server made at its start (:class:`~._apache.Apache` run by root); a test that
    changes a file under the running server changes it there."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__()
        self.root = Path(root).resolve()
        self.served = self.root
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._log = ""  # the access log, kept when it stops
        self._said = ""  # the error log, kept when it stops

    def _work_folder(self, what: str) -> Path:
        """A new work folder for this start (the last one's logs forgotten)."""
        self._dir = tempfile.TemporaryDirectory(prefix=f"asyncloader-{what}-")
        self._log = self._said = ""
        return Path(self._dir.name)

    def _access_log(self) -> str:
        """The access log's text: as it is now while the server runs, as it was when it
        stopped afterwards."""
        if self._dir is None:
            return self._log
        log = Path(self._dir.name) / "access.log"
        return log.read_text() if log.exists() else ""

    def _launch(
        self, argv: list[str], port: int, what: str, env: dict[str, str] | None = None
    ) -> None:
        """Start ``argv`` (a server that listens on 127.0.0.1:``port``; it dies with this
        process; ``env``: its environment, else this process's) and wait until it answers;
        else stop it and raise with what its error log says."""
        self._proc = subprocess.Popen(
            argv,
            env=env,
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

    def stop(self) -> None:
        super().stop()  # a server writes out what it buffered as it stops
        work, self._dir = self._dir, None
        if work is not None:
            access, errors = Path(work.name) / "access.log", Path(work.name) / "error.log"
            self._log = access.read_text() if access.exists() else ""
            self._said = errors.read_text() if errors.exists() else ""
            work.cleanup()
