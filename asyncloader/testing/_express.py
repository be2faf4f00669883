"""Express, Node's web framework, serving a folder the way its users do: ``express.static``
for the files and the ``serve-index`` middleware for folder pages (HTML whose folder links
lack their trailing ``/``, with each file's size; the names alone in JSON for a request
that prefers JSON), on 127.0.0.1, every answer written to an access log the test reads
back.  The npm packages come from ``.ci/node/`` (``.ci/run`` installs them beside
Azurite)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ._servers import free_port
from ._webserver import Answer, WebServer, read_answers

__all__ = ["Express", "find_express"]

_SERVER_JS = r"""
const express = require("express");
const serveIndex = require("serve-index");
const fs = require("fs");
const [root, port, log] = process.argv.slice(2);
const app = express();
app.use((req, res, next) => {
  res.on("finish", () => {
    const sent = res.getHeader("content-length");
    const range = req.headers.range || "-";
    const line = `${req.method} ${req.originalUrl} ${res.statusCode} ${sent || "-"} "${range}"\n`;
    fs.appendFileSync(log, line); // at once: a stopped server leaves no line unwritten
  });
  next();
});
app.use(express.static(root, { index: false }), serveIndex(root));
app.listen(Number(port), "127.0.0.1");
// Stopped: a moment for the answers just sent to be logged ("finish" runs after the send).
process.on("SIGTERM", () => setTimeout(() => process.exit(0), 200));
"""


def find_express() -> tuple[str, str] | None:
    """``node`` and the ``node_modules`` folder that holds ``express`` and ``serve-index``
    (``$ASYNCLOADER_NODE_MODULES``, else ``.ci/node/node_modules`` of the current or the
    package's directory); None when either is missing."""
    node = shutil.which("node")
    given = os.environ.get("ASYNCLOADER_NODE_MODULES")
    rel = Path(".ci", "node", "node_modules")
    places = [Path(given)] if given else []
    places += [root / rel for root in (Path.cwd(), Path(__file__).resolve().parents[2])]
    for modules in places:
        if node and (modules / "express").is_dir() and (modules / "serve-index").is_dir():
            return node, str(modules)
    return None


class Express(WebServer):
    """Express serving ``root`` on 127.0.0.1 with ``express.static`` and ``serve-index``.

    ``endpoint`` is ``http://127.0.0.1:PORT``; :meth:`answers` reads the access log (a
    line as each answer ends: the method, the path as sent, the status, the
    ``Content-Length`` sent, the Range asked)."""

    def start(self) -> None:
        found = find_express()
        if found is None:
            raise FileNotFoundError(
                "node with express and serve-index not found: `npm install --prefix .ci/node "
                "express serve-index` (bash .ci/run does this), or set ASYNCLOADER_NODE_MODULES"
            )
        node, modules = found
        work = self._work_folder("express")
        port = free_port()
        script = work / "server.js"
        script.write_text(_SERVER_JS)
        argv = [node, str(script), str(self.root), str(port), str(work / "access.log")]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._launch(argv, port, "express", {**os.environ, "NODE_PATH": modules})

    def answers(self) -> list[Answer]:
        """Every answer so far, in order."""
        return read_answers(self._access_log())
