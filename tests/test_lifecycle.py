"""One lifecycle budget (``_base/_lifecycle.py``): each stage of a stop waits no longer than
the stage above gives it, and a child that ignores being asked is terminated, then killed,
within the budget."""

from __future__ import annotations

import subprocess
import sys
import time

from asyncloader._base import _lifecycle as life
from asyncloader._loader._launch import stop_children


def test_an_engine_finishes_its_own_teardown_before_its_trainer_stops_waiting() -> None:
    steps = (
        life.STOP_PRODUCTION,
        life.WRITER_DRAIN,
        life.POOL_STOP,
        life.STORE_CLOSE,
        life.TASKS_CANCEL,
    )
    assert sum(steps) == life.RUNTIME_SHUTDOWN
    assert life.ENGINE_TEARDOWN == life.RUNTIME_SHUTDOWN + life.LOOP_JOIN + life.EXECUTOR_END
    assert life.ENGINE_TEARDOWN < life.ENGINE_GRACE
    assert life.POOL_STOP >= 3 * life.WORKER_STEP  # ask, terminate, kill
    # The trainer's stop of an engine, whole, is far under the suite's 120 s per test.
    assert life.ENGINE_GRACE + 2 * life.KILL_STEP + life.READER_JOIN < 120
    assert all(v > 0 for k, v in vars(life).items() if k.isupper())


def _child(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    return proc


def test_children_are_asked_then_terminated_then_killed_on_one_deadline() -> None:
    polite = _child("import sys, time; print('up', flush=True); sys.stdin.read()")
    stubborn = [
        _child(
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)"
        )
        for _ in range(3)
    ]
    polite.terminate()  # stands for "asked, and stopping"
    t0 = time.monotonic()
    stop_children([polite, *stubborn], grace=0.5, step=0.5)
    took = time.monotonic() - t0
    assert polite.returncode is not None
    assert [p.returncode for p in stubborn] == [-9, -9, -9]  # SIGTERM ignored, SIGKILLed
    assert took < 0.5 + 2 * 0.5 + 1.0  # one deadline per step, not one per child
    for p in (polite, *stubborn):
        assert p.stdout is not None
        p.stdout.close()
