"""What shared memory processes hold: the loader's memfds (Linux) and its POSIX segments."""

from __future__ import annotations

import os
from collections.abc import Iterable

from asyncloader._base._shm import SHM_PREFIX


def memfds(pid: int) -> set[int]:
    """The loader's memfds process ``pid`` holds open or mapped (their inodes): its rings
    on Linux.  Empty once it is gone."""
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read().splitlines()
    except OSError:
        return out
    for fd in fds:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:asyncloader"):
                out.add(os.stat(path).st_ino)
        except OSError:
            continue  # closed meanwhile
    for line in maps:
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith("/memfd:asyncloader"):
            out.add(int(fields[4]))
    return out


def segments(pids: Iterable[int]) -> set[str]:
    """The POSIX segments in /dev/shm that processes ``pids`` made (none on Linux, where
    segments are memfds, unless one leaked)."""
    prefixes = tuple(f"{SHM_PREFIX}{pid}_" for pid in pids)
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefixes)} if prefixes else set()
