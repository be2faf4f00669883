"""Folders this package makes for its own files (a cache folder): its owner's only, or its
group's too.  On a shared node the cached objects of a private bucket are no one else's to
read, so a folder is never made readable by all."""

from __future__ import annotations

import os

__all__ = ["make_folder"]


def make_folder(path: str | os.PathLike[str], *, group_shared: bool = False) -> None:
    """Make ``path`` (and its missing parents) if it is missing: ``drwx------``, or with
    ``group_shared`` ``drwxrws---`` (set-group-ID, so what is made inside belongs to the
    group).  A folder that exists keeps its permissions."""
    if os.path.isdir(path):
        return
    mode = 0o2770 if group_shared else 0o700
    try:
        os.makedirs(path, mode=mode)
    except FileExistsError:  # another process of the node made it first
        return
    os.chmod(path, mode)  # makedirs' mode passes through the umask
