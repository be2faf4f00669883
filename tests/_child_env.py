"""A child process (started by ``_base/_child.launch``) that reports its environment."""

from __future__ import annotations

import os

from asyncloader._loader._launch import receive_order


def report(fd: int) -> None:
    got = receive_order(fd)
    if got is None:
        return
    conn, _, _ = got
    conn.send(dict(os.environ))
    conn.close()
