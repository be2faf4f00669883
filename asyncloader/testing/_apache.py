"""Apache httpd, the server behind many a dataset mirror, on 127.0.0.1: a folder served with
``mod_autoindex`` folder pages as Debian configures them (an HTML table: sort links, a
parent link, sizes rounded to ``K``/``M``), its parent process in the foreground
(``-DFOREGROUND``, as Debian's service runs it: the event MPM's workers as configured by
default; ``-X``'s single process of 25 threads stalls for its keep-alive timeout under a
loader's many connections), every answer written to an access log the test reads back.

Apache will not serve as root: run by root, it serves as ``www-data``, so it serves a copy
of the folder (links followed) in its work folder, which that user can read; the copy is
made at the start (``served``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ._servers import free_port
from ._webserver import Answer, WebServer, read_answers

__all__ = ["Apache", "find_apache"]

_MODULES = Path("/usr/lib/apache2/modules")


def find_apache() -> str | None:
    """The ``apache2`` executable: ``$APACHE2``, one on PATH, or Debian's
    ``/usr/sbin/apache2`` (``apt-get install apache2-bin``; ``.ci/run`` installs it), where
    Debian's modules are there too; None otherwise."""
    exe = os.environ.get("APACHE2") or shutil.which("apache2")
    if not exe and os.access("/usr/sbin/apache2", os.X_OK):
        exe = "/usr/sbin/apache2"
    return exe if exe and (_MODULES / "mod_autoindex.so").exists() else None


class Apache(WebServer):
    """Apache httpd serving (a copy of) ``root`` on 127.0.0.1 with its folder pages on.

    ``endpoint`` is ``http://127.0.0.1:PORT``; :meth:`answers` reads the access log."""

    def start(self) -> None:
        exe = find_apache()
        if exe is None:
            raise FileNotFoundError(
                "apache2 not found: apt-get install apache2-bin (Debian), or set APACHE2"
            )
        work = self._work_folder("apache")
        served = work / "site"
        shutil.copytree(self.root, served, symlinks=False)
        self.served = served
        user = ""
        if os.geteuid() == 0:  # it serves as www-data, who must reach the copy
            for folder in (work, *(p for p in served.rglob("*") if p.is_dir()), served):
                folder.chmod(0o755)
            for path in served.rglob("*"):
                if path.is_file():
                    path.chmod(0o644)
            user = "User www-data\nGroup www-data"
        port = free_port()
        config = work / "httpd.conf"
        modules = ("mpm_event", "authz_core", "dir", "autoindex", "mime")
        config.write_text(
            "\n".join(f"LoadModule {m}_module {_MODULES / f'mod_{m}.so'}" for m in modules)
            + f"""
ServerRoot "{work}"
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
PidFile "{work / "httpd.pid"}"
ErrorLog "{work / "error.log"}"
{user}
TypesConfig /dev/null
AddType image/jpeg .jpg .jpeg
AddType image/png .png
AddType text/plain .txt .jsonl
AddType application/json .json
LogFormat "%>s %B \\"%{{Range}}i\\" %r" answers
CustomLog "{work / "access.log"}" answers
DocumentRoot "{served}"
<Directory "{served}">
    Options Indexes FollowSymLinks
    Require all granted
</Directory>
IndexOptions FancyIndexing VersionSort HTMLTable NameWidth=* DescriptionWidth=* Charset=UTF-8
"""
        )
        self.endpoint = f"http://127.0.0.1:{port}"
        self._launch([exe, "-DFOREGROUND", "-f", str(config)], port, "apache")

    def answers(self) -> list[Answer]:
        """Every answer so far, in order (a line as each answer ends).  Apache logs a path
        decoded (``%U``: spaces and all), so its lines hold the request line as sent
        (``%r``), last, and are put in the others' order here."""
        lines = []
        for line in self._access_log().splitlines():
            status, sent, rest = line.split(" ", 2)
            rng, _, request = rest.rpartition('" ')
            method, target = request.split(" ")[:2]
            lines.append(f'{method} {target} {status} {sent} {rng}"')
        return read_answers("\n".join(lines))
