"""``peer_processes``: the processes of this machine at the other end of this process's TCP
connections, found in ``/proc`` (``bench`` charges their CPU per GET to a local store and
nothing else to it).  Real sockets to real processes: a server that spends a known CPU time
per request, a neighbour that spins and is not connected, a server listening on ``::``
reached over IPv4, and a server in this very process.

The server says its port and answers only when asked, so each figure is read at a known
point of its work however loaded the machine is."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncloader._base._proctree import _address, own_cpu_seconds, peer_processes

from .conftest import spinning_neighbour

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

SPEND = 0.3
"""CPU seconds the server spends on each request before it answers."""

_SERVER = """
import socket, sys, time
family = socket.AF_INET6 if sys.argv[1] == "::" else socket.AF_INET
srv = socket.socket(family)
if family == socket.AF_INET6:
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
srv.bind((sys.argv[1], 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
while conn.recv(16):
    t = time.process_time()
    while time.process_time() - t < float(sys.argv[2]):
        pass
    conn.sendall(b"done")
"""


@contextmanager
def _process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _ask(conn: socket.socket) -> None:
    conn.sendall(b"go")
    answer = b""
    while len(answer) < 4:
        part = conn.recv(16)
        assert part, "the server closed the connection"
        answer += part
    assert answer == b"done"


def _dual_stack() -> bool:
    """Whether this machine listens on ``::`` for IPv4 too (a container may have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", 0))
    except (OSError, AttributeError):
        return False
    return True


@pytest.mark.parametrize("listen", ["127.0.0.1", "::"])
def test_the_process_answering_is_named_and_a_neighbour_is_not(listen: str) -> None:
    """A server listening on ``::`` sees the IPv4 client as ``::ffff:127.0.0.1`` in
    ``/proc/net/tcp6``: the same connection, matched from both ends."""
    if listen == "::" and not _dual_stack():
        pytest.skip("no IPv6 here")
    with _process(_SERVER, listen, str(SPEND)) as (server, port), spinning_neighbour() as spinner:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=60) as conn:
            before = own_cpu_seconds()
            _ask(conn)
            peers = peer_processes()
            after = own_cpu_seconds()
        assert peers is not None
        assert server.pid in peers and spinner.pid not in peers
        # The server's own CPU between the two readings holds the request's (ticks of
        # 10 ms: a tick either side).
        assert after[server.pid] - before[server.pid] >= SPEND - 0.02
    assert server.pid not in (peer_processes() or set())  # the connection is closed


def test_a_server_in_this_process_is_not_a_peer() -> None:
    """Its CPU is this process's own already."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(srv.accept()[0]))
    thread.start()
    with srv, socket.create_connection(srv.getsockname(), timeout=60):
        thread.join(timeout=60)
        peers = peer_processes()
        accepted[0].close()
    assert peers is not None and os.getpid() not in peers


def _proc_form(ip: bytes, port: int) -> str:
    """An address as the kernel writes it in ``/proc/net/tcp``: each 32-bit word in the
    host's byte order, in hex, and the port in hex."""
    words = [ip[i : i + 4] for i in range(0, len(ip), 4)]
    if sys.byteorder == "little":
        words = [w[::-1] for w in words]
    return f"{b''.join(words).hex().upper()}:{port:04X}"


@given(st.ip_addresses(), st.integers(0, 65535))
def test_proc_net_tcp_addresses_read_back(ip: object, port: int) -> None:
    assert isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)
    expected = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    assert _address(_proc_form(ip.packed, port)) == (str(expected or ip), port)


def test_no_open_connection_names_nothing() -> None:
    """A server that closes each connection after its answer (HTTP/1.0's way) leaves none
    open by the time the peers are asked for: whether it ran here cannot be told, which
    is not the same as "elsewhere" (``bench`` then falls back to the machine's busy
    time).  A process of its own, with no connection of any kind: the module alone."""
    from asyncloader._base import _proctree

    load = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('p', {_proctree.__file__!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "print(m.peer_processes())"
    )
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None", done.stderr
