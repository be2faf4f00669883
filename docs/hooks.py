"""MkDocs hooks.

* ``<!-- help: COMMAND -->`` in a page becomes the live ``asyncloader COMMAND --help``
  output, so the CLI page always shows the options the installed command has.
* The docstrings' cross-references in reStructuredText (``:class:`~asyncloader.X```, the
  ``::`` before an indented example), which the API reference shows as written, become
  plain code names and a colon.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

_MARK = re.compile(r"<!-- help:(?P<command>[a-z ]*)-->")
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):<code>(~?)([\w.]+)(\(\))?</code>")
_LITERAL = re.compile(r"(<p>[^<]*?):?:</p>")


def _help(command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "asyncloader", *command.split(), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "78"},
    )
    return "```text\n" + out.stdout.rstrip() + "\n```"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return _MARK.sub(lambda m: _help(m.group("command").strip()), markdown)


def _name(m: re.Match[str]) -> str:
    short, name, call = m.group(1), m.group(2), m.group(3) or ""
    return f"<code>{name.rsplit('.', 1)[-1] if short else name}{call}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    html = _ROLE.sub(_name, html)
    html = html.replace("<p>::</p>", "")
    return _LITERAL.sub(lambda m: m.group(1) + ":</p>", html)
