"""A process and the processes below it (Linux ``/proc``): who they are, and the CPU time
they spent together — the one measure every CPU figure of the project uses (the demo's
summary, the benchmarks), so that work moved into engine processes and their decode
processes is counted wherever it runs (a leaf).  And the processes of this machine that
answer a process's TCP connections (a local emulator, a proxy on the node), so that what
they spend is told from what a neighbour spends meanwhile."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import resource
import sys
from collections.abc import Collection, Iterator

__all__ = [
    "alive",
    "descendants",
    "machine_busy_seconds",
    "own_cpu_seconds",
    "peer_processes",
    "process_cpu_seconds",
    "process_rss_bytes",
    "tree_cpu_seconds",
]


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 on)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs (a zombie does not; another
    user's does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:
        state = _stat(pid)[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _stats() -> Iterator[tuple[int, list[str]]]:
    """Each live process's id and its ``_stat`` fields; none where ``/proc`` is missing (a
    process that ends while they are read is left out)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            try:
                fields = _stat(int(entry))
            except (OSError, IndexError):
                continue
            yield int(entry), fields


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, fields in _stats():
        with contextlib.suppress(IndexError, ValueError):
            out.setdefault(int(fields[1]), []).append(pid)
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


def own_cpu_seconds() -> dict[int, float]:
    """Every process's own CPU time now (user + system, not its children's) [seconds], by
    process id; empty where ``/proc`` is missing.  Two of them, and the processes that
    matter named in between (``peer_processes``), measure what those spent."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")  # once, not once per process of the machine
    for pid, fields in _stats():
        with contextlib.suppress(IndexError, ValueError):  # utime, stime: fields 14 and 15
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


_Address = tuple[str, int]
_ESTABLISHED = "01"


def _address(text: str) -> _Address:
    """``/proc/net/tcp``'s ``HEX_IP:HEX_PORT`` (the address's 32-bit words in the host's
    byte order) as (IP, port), an IPv4-mapped IPv6 address as its IPv4 one: a client of
    IPv4 and a server listening on ``::`` see the same connection from its two ends."""
    hex_ip, hex_port = text.split(":")
    raw = bytes.fromhex(hex_ip)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(hex_port, 16)


def _tcp_sockets() -> Iterator[tuple[_Address, _Address, str, int]]:
    """This network namespace's TCP sockets: (local, remote, state, inode)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)  # the header
            for line in f:
                with contextlib.suppress(IndexError, ValueError):
                    fields = line.split()
                    yield _address(fields[1]), _address(fields[2]), fields[3], int(fields[9])


def _socket_inodes(pid: int | str) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open; empty where unreadable."""
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
    return out


def peer_processes() -> set[int] | None:
    """The processes of this machine at the other end of this process's open TCP
    connections (a local emulator, a proxy on the node; not this process itself): empty
    where every peer is elsewhere; None where a peer runs here but its process could not
    be named (another user's, say), where this process has no open connection to tell
    from (a server that closes each one after its answer, as ``python -m http.server``
    does, left none open: it may well run here) or ``/proc`` is missing."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    mine = _socket_inodes("self")
    sockets = list(_tcp_sockets())
    peer_ends = {
        (remote, local)
        for local, remote, state, inode in sockets
        if inode in mine and state == _ESTABLISHED
    }
    if not peer_ends:
        return None
    wanted = {
        inode
        for local, remote, _state, inode in sockets
        if (local, remote) in peer_ends and inode not in mine and inode != 0
    }
    found: set[int] = set()
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not wanted - found:
                break
            if entry.isdigit() and int(entry) != os.getpid():
                held = _socket_inodes(entry) & wanted
                if held:
                    found |= held
                    out.add(int(entry))
    return out if found == wanted else None
