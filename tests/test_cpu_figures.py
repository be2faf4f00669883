"""Every CPU figure counts the whole process tree below the measuring process
(``tree_cpu_seconds``): work done in a grandchild (a decode process below an engine
process) counts while it runs, after its parent has reaped it, and once the parent is
reaped too; a process left out is left out with everything below it.

The processes say where they are (a line each) and wait to be told to go on, so each
figure is read at a known point of their work however loaded the machine is (the suite
runs three test processes on two cores): no sleep stands for "it has run by now"."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from asyncloader.testing import tree_cpu_seconds

SPIN = 0.6
"""CPU seconds the grandchild spends before it says ``spun``."""

# A child that starts a grandchild, says `started`, then lets the grandchild spin: it
# spends `s` seconds of its own CPU, says so (on the same stdout) and waits, alive, until
# its stdin closes. On a line of its own stdin the child lets the grandchild end, waits
# for it (reaping it) and says `reaped`; then it waits for its own stdin to close.
CHILD = """
import subprocess, sys
spin = (
    "import sys, time\\nsys.stdin.readline()\\nt = time.process_time()\\n"
    "while time.process_time() - t < {s}: pass\\nprint('spun', flush=True)\\nsys.stdin.read()"
)
g = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
print("started", flush=True)
g.stdin.write(b"spin\\n")
g.stdin.flush()
sys.stdin.readline()
g.stdin.close()
g.wait()
print("reaped", flush=True)
sys.stdin.read()
"""


@contextmanager
def _child(seconds: float) -> Iterator[subprocess.Popen[str]]:
    """The child (above), ended however the test ends: its stdin closed lets it and the
    grandchild end (the grandchild after its spin); killed if they have not in 30 s."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(s=seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        yield child
    finally:
        if not child.stdin.closed:
            child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()  # the grandchild's stdin closes with it: it ends after its spin
            child.wait()
        child.stdout.close()


def _go_on(child: subprocess.Popen[str]) -> None:
    """Tell the child to let the grandchild end."""
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()


def test_a_grandchilds_cpu_counts_while_it_runs_and_once_it_is_reaped() -> None:
    before = tree_cpu_seconds()
    with _child(SPIN) as child:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "started\n"
        assert child.stdout.readline() == "spun\n"
        # The grandchild, alive below a live child, has spent SPIN seconds: /proc gives
        # them in clock ticks (truncated), hence the margin.
        running = tree_cpu_seconds() - before
        assert running >= SPIN - 0.05
        _go_on(child)
        assert child.stdout.readline() == "reaped\n"
        reaped = tree_cpu_seconds() - before
        assert reaped >= SPIN  # in the live child's account of the children it waited for
        child.stdin.close()
        child.wait()
    ended = tree_cpu_seconds() - before
    assert ended >= reaped - 0.05  # now in this process's account: not lost, not doubled
    assert ended < SPIN + 2.0  # the two interpreters' start-up, and nothing counted twice


def test_a_process_left_out_is_left_out_with_its_children() -> None:
    with _child(SPIN) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "started\n"
        before = tree_cpu_seconds(exclude=(child.pid,))
        assert child.stdout.readline() == "spun\n"
        _go_on(child)
        assert child.stdout.readline() == "reaped\n"
        assert tree_cpu_seconds(exclude=(child.pid,)) - before < 0.2
