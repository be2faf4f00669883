"""Caddy, a third web server nobody here wrote, on 127.0.0.1: a folder served by its
``file_server`` with ``browse`` on (folder pages: HTML for a browser, a list in JSON, with
each file's exact size, for a request that accepts JSON), in the configuration a test asks
for, every answer written to an access log (Caddy's JSON lines) the test reads back."""

from __future__ import annotations

import json
import os
import shutil
from urllib.parse import unquote

from ._servers import free_port
from ._webserver import Answer, WebServer

__all__ = ["Caddy", "find_caddy"]


def find_caddy() -> str | None:
    """The ``caddy`` executable: ``$CADDY``, or one on PATH (Debian's ``apt-get install
    caddy``; ``.ci/run`` installs it); None when there is none."""
    return os.environ.get("CADDY") or shutil.which("caddy")


class Caddy(WebServer):
    """Caddy serving ``root`` on 127.0.0.1 over plain HTTP, folder pages on (``file_server
    browse``), no admin endpoint, no automatic HTTPS; its state in a folder of its own.

    Args:
        root: The folder served at ``/``.
        site: More directives for the site block, as a Caddyfile writes them
            (``"encode gzip"``, ``"header Cache-Control no-store"``, ...).

    ``endpoint`` is ``http://127.0.0.1:PORT``; :meth:`answers` reads the access log.
    """

    def __init__(self, root: str | os.PathLike[str], *, site: str = "") -> None:
        super().__init__(root)
        self.site = site

    def start(self) -> None:
        exe = find_caddy()
        if exe is None:
            raise FileNotFoundError("caddy not found: apt-get install caddy (Debian), or set CADDY")
        work = self._work_folder("caddy")
        port = free_port()
        config = work / "Caddyfile"
        config.write_text(
            f"""{{
    admin off
    auto_https off
    log {{
        output file {json.dumps(str(work / "error.log"))}
    }}
}}
http://127.0.0.1:{port} {{
    root * {json.dumps(str(self.root))}
    file_server browse
    log {{
        output file {json.dumps(str(work / "access.log"))}
    }}
    {self.site}
}}
"""
        )
        # Its data and configuration folders (certificates, autosaves) in the work folder.
        env = {**os.environ, "XDG_DATA_HOME": str(work), "XDG_CONFIG_HOME": str(work)}
        argv = [exe, "run", "--config", str(config), "--adapter", "caddyfile"]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._launch(argv, port, "caddy", env)

    def answers(self) -> list[Answer]:
        """Every answer so far, in order (Caddy writes a line as each answer ends)."""
        text = self._access_log()
        out = []
        for line in text.splitlines():
            entry = json.loads(line)
            asked = entry["request"]
            path = unquote(str(asked["uri"]).partition("?")[0])
            ranges = asked.get("headers", {}).get("Range") or [""]
            status, size = int(entry["status"]), int(entry.get("size", 0))
            out.append(Answer(asked["method"], path, status, size, ranges[0]))
        return out
