"""Every CPU figure counts the whole process tree below the measuring process
(``tree_cpu_seconds``): work done in a grandchild (a decode process below an engine
process) counts while it runs, after its parent has reaped it, and once the parent is
reaped too; a process left out is left out with everything below it."""

from __future__ import annotations

import subprocess
import sys
import time

from asyncloader.testing import tree_cpu_seconds

# A child that starts a grandchild which spins for `s` seconds of CPU, then waits for it
# (reaping it) and says so, then waits for its stdin to close.
CHILD = """
import subprocess, sys
spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {s}: pass"
g = subprocess.Popen([sys.executable, "-c", spin])
print("started", flush=True)
g.wait()
print("reaped", flush=True)
sys.stdin.read()
"""


def _child(seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD.format(s=seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_grandchilds_cpu_counts_while_it_runs_and_once_it_is_reaped() -> None:
    before = tree_cpu_seconds()
    child = _child(0.6)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "started\n"
    time.sleep(0.3)
    running = tree_cpu_seconds() - before
    assert running > 0.1  # the grandchild, live, below a live child
    assert child.stdout.readline() == "reaped\n"
    reaped = tree_cpu_seconds() - before
    assert reaped >= 0.6  # in the live child's account of the children it waited for
    child.stdin.close()
    child.wait()
    child.stdout.close()
    ended = tree_cpu_seconds() - before
    assert ended >= reaped - 0.05  # now in this process's account: not lost, not doubled
    assert ended < 0.6 + 2.0  # the two interpreters' start-up, and nothing counted twice


def test_a_process_left_out_is_left_out_with_its_children() -> None:
    child = _child(0.6)
    assert child.stdout is not None and child.stdin is not None
    try:
        assert child.stdout.readline() == "started\n"
        before = tree_cpu_seconds(exclude=(child.pid,))
        assert child.stdout.readline() == "reaped\n"
        assert tree_cpu_seconds(exclude=(child.pid,)) - before < 0.2
    finally:
        child.stdin.close()
        child.wait()
        child.stdout.close()
