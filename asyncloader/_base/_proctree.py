"""A process and the processes below it (Linux ``/proc``): who they are, and the CPU time
they spent together — the one measure every CPU figure of the project uses (the demo's
summary, the benchmarks), so that work moved into engine processes and their decode
processes is counted wherever it runs (a leaf)."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Collection

__all__ = [
    "descendants",
    "machine_busy_seconds",
    "process_cpu_seconds",
    "process_rss_bytes",
    "tree_cpu_seconds",
]


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 on)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    out.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
    return out


def descendants(pid: int, exclude: Collection[int] = ()) -> list[int]:
    """Every live process below ``pid``, children first, without the processes of
    ``exclude`` and those below them; empty where ``/proc`` is missing."""
    children = _children()
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in exclude:
                out.append(child)
                todo.append(child)
    return out


def tree_cpu_seconds(exclude: Collection[int] = ()) -> float:
    """CPU time (user + system) of this process and every process below it [seconds]:
    the live ones' own, and what each of them (and this one) collected from the children
    it waited for, which holds theirs in turn; nothing is counted twice.  ``exclude``:
    processes left out with those below them (a server the measurement runs against).
    Differences of two calls measure what happened between them, as long as no excluded
    process ends between them."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime
    return total + sum(process_cpu_seconds(pid) for pid in descendants(os.getpid(), exclude))


def process_cpu_seconds(pid: int | None) -> float:
    """CPU time of process ``pid`` and the children it waited for [seconds]; 0 where it or
    ``/proc`` is missing."""
    if pid is None:
        return 0.0
    try:
        fields = _stat(pid)  # utime, stime, cutime, cstime: fields 14-17
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def process_rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` now [bytes]; 0 where it or ``/proc`` is missing."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine has spent so far (Linux ``/proc/stat``; 0
    elsewhere): beside a process's own, it tells what else runs meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    except (OSError, ValueError):
        return 0.0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
