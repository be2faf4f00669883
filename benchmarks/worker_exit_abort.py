"""A check, not a benchmark: do spawned DataLoader workers abort at shutdown when their
iterator is deleted mid-epoch, with and without ``let_feeders_finish_at_exit``?

Runs ``tests/_worker_exit_child.py`` (an endless dataset of ``--mb`` MB float32 tensors, a
DataLoader with 2 spawned workers and ``prefetch_factor=4``, deleted after 3 batches,
``--rounds`` times) once per case, from the repository root.  A worker whose queue feeder
thread is still pickling a tensor (torch's ``_share_fd_cpu_``, in C++ without the GIL) when
its interpreter finalizes aborts: "terminate called without an active exception" on its
stderr, counted here (see ``asyncloader/_base/_worker_exit.py``).

Run: ``python benchmarks/worker_exit_abort.py [--rounds 10] [--mb 8]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--mb", type=int, default=8)
    args = p.parse_args()
    print(f"{args.rounds} rounds of 2 spawned workers, {args.mb} MB tensors")
    for case in ("plain", "hook"):
        t0 = time.perf_counter()
        child = ["-m", "tests._worker_exit_child", str(args.rounds), str(args.mb), case]
        out = subprocess.run(
            [sys.executable, *child],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        aborted = out.stderr.count("terminate called without an active exception")
        print(
            f"{case:6s} workers aborted: {aborted} of {2 * args.rounds}  "
            f"({time.perf_counter() - t0:.1f} s, exit status {out.returncode})"
        )


if __name__ == "__main__":
    main()
