"""Clean shutdown: no threads, processes or shared memory left behind, whatever happens."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import S3TestServer, descendants

from ._shm import memfds, segments


def _shm() -> tuple[set[int], set[str]]:
    """The shared memory this process holds: memfds, and POSIX segments it made (another
    test run on the machine has its own)."""
    return memfds(os.getpid()), segments([os.getpid()])


def _children() -> set[tuple[str, str]]:
    """Our child processes (pid, command line), but multiprocessing's one resource tracker
    per interpreter."""
    kids = _child_cmdlines(os.getpid())
    return {
        (k, c.decode(errors="replace")) for k, c in kids.items() if b"resource_tracker" not in c
    }


def _child_cmdlines(pid: int) -> dict[str, bytes]:
    """The live children of ``pid``: pid → command line."""
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {k: cmd for k in kids.split() if (cmd := _cmdline(k))}


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("asyncloader")]


def _loader(server: S3TestServer, engines: int) -> al.ImageLoader:
    """A loader of 2 decode workers: one engine with both, or two of one decode thread each
    (as where decode holds the GIL)."""
    return al.ImageLoader(
        "s3://b/train/",
        batch_size=8,
        engine=al.EngineConfig(processes=engines),
        decode=al.DecodeConfig(workers=2),
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),
    )


@pytest.mark.parametrize("engines", [1, 2])
@pytest.mark.parametrize("how", ["close", "break", "exception", "gc"])
def test_nothing_left_behind(light_server: S3TestServer, engines: int, how: str) -> None:
    import gc

    gc.collect()  # what earlier tests left in reference cycles goes now, not during this one
    shm_before, children_before = _shm(), _children()
    t0 = time.monotonic()
    if how == "close":
        loader = _loader(light_server, engines)
        next(iter(loader))
        loader.close()
        loader.close()  # idempotent
        with pytest.raises(al.ClosedError):
            iter(loader)
    elif how in ("break", "exception"):
        with contextlib.suppress(ZeroDivisionError), _loader(light_server, engines) as loader:
            for images, _ in loader:  # noqa: B007 -- kept after the loop on purpose
                if how == "break":
                    break
                1 / 0  # noqa: B018
        # The batch the loop body held outlives the loader: still readable, and its memory
        # goes when it does.
        assert _loop_threads() == []
        assert images.shape[0] == 8 and int(images.sum()) > 0
        del images, _
    else:
        loader = _loader(light_server, engines)
        next(iter(loader))
        del loader
        gc.collect()
    assert time.monotonic() - t0 < 20
    assert _loop_threads() == []
    assert _shm() == shm_before
    assert _children() <= children_before  # nothing new (an older child may have exited)


SCRIPT = textwrap.dedent(
    """
    import signal, sys, time, asyncloader as al
    # Ctrl-C as in a terminal, even when the tests run as a shell's background job (which
    # starts its children with SIGINT ignored, so Python would install no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print("SCRIPT RAN", flush=True)  # once: engine processes do not import the script
    def main():
        engine = al.EngineConfig(processes=int(sys.argv[2]), prefetch_batches=2)
        loader = al.ImageLoader("s3://b/train/", batch_size=4, decode=al.DecodeConfig(workers=2),
                                shuffle=False, engine=engine,
                                store=al.StoreConfig(options={"endpoint_url": sys.argv[1]}))
        # At most argv[3] epochs: whatever the machine's speed, the run is still going when
        # the test interrupts it.
        for epoch in range(int(sys.argv[3])):
            for i, _ in enumerate(loader):
                if epoch == 0 and i == 1:
                    print("STREAMING", flush=True)
                time.sleep(0.05)  # a slow training step: an epoch lasts over a second
        print("EPOCH DONE", flush=True)
    if __name__ == "__main__":
        main()
    """
)


def _start(
    tmp_path: Path, server: S3TestServer, engines: int, epochs: int
) -> subprocess.Popen[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), server.endpoint, str(engines), str(epochs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "SCRIPT RAN"
    assert proc.stdout.readline().strip() == "STREAMING"
    return proc


def _engines(pid: int) -> list[int]:
    """The engine processes below ``pid``."""
    return [p for p in descendants(pid) if b"engine_main" in _cmdline(str(p))]


def _tree_memfds(pid: int) -> set[int]:
    """The memfds of ``pid`` and of every process below it (its engines' rings)."""
    return set().union(*(memfds(p) for p in [pid, *descendants(pid)]))


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""  # gone


@pytest.mark.slow
@pytest.mark.parametrize("engines", [1, 2])
def test_ctrl_c_mid_epoch(light_server: S3TestServer, tmp_path: Path, engines: int) -> None:
    light_server.set_faults({}, latency=0.05)  # keep the epoch going long enough
    proc = _start(tmp_path, light_server, engines, epochs=100)  # interrupted long before
    try:
        below = descendants(proc.pid)
        workers = _engines(proc.pid)
        # Two levels of processes: the script and its engines, each mapping its one ring.
        assert len(workers) == engines
        assert set(below) == set(workers)
        assert len(_tree_memfds(proc.pid)) == engines
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.communicate()  # reaped, pipes closed, whatever happened above
    assert "KeyboardInterrupt" in err
    assert proc.returncode != 0
    assert "SCRIPT RAN" not in out
    assert segments([proc.pid, *below]) == set()
    deadline = time.monotonic() + 10  # a resource tracker ends just after its process
    while [p for p in below if _cmdline(str(p))] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in below if _cmdline(str(p))] == []
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""
    assert [w for w in workers if _cmdline(str(w))] == []


HOOK_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, asyncloader as al
    def decode(data):  # defined in the script: engines must import it to unpickle the spec
        return np.full((1, 2, 2), len(data) % 251, np.uint8)
    if __name__ == "__main__":
        hook = al.DecodeConfig(workers=2, hook=decode, sample_shape=(1, 2, 2))
        with al.ImageLoader("s3://b/train/", batch_size=4, shuffle=False, decode=hook,
                            store=al.StoreConfig(options={"endpoint_url": sys.argv[1]})) as loader:
            images, _ = next(iter(loader))
            sizes = [s.obj.size % 251 for s in loader.dataset.samples[:4]]
            # A hook holds the GIL: an engine process per decode worker, one thread each.
            print("OK", images[:, 0, 0, 0].tolist() == sizes, loader.engine_processes)
    """
)


def _run_script(path: Path, body: str, server: S3TestServer) -> subprocess.CompletedProcess[str]:
    path.write_text(body)
    return subprocess.run(
        [sys.executable, str(path), server.endpoint], capture_output=True, text=True, timeout=120
    )


def test_decode_hook_defined_in_the_script(light_server: S3TestServer, tmp_path: Path) -> None:
    out = _run_script(tmp_path / "hook.py", HOOK_SCRIPT, light_server)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OK True 2"


def test_decode_hook_in_an_unguarded_script_is_a_clear_error(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """Engines import the script for its hook; a script that then makes a loader again must
    fail with the guard hint, not start engines of engines."""
    body = HOOK_SCRIPT.replace('if __name__ == "__main__":\n    ', "if True:\n    ")
    assert "__main__" not in body
    out = _run_script(tmp_path / "unguarded.py", body, light_server)
    assert out.returncode != 0
    assert "could not start" in out.stderr  # an engine process's
    assert "if __name__ == '__main__':" in out.stderr
    # An engine importing the script refused to start engines of its own.
    assert "bootstrapping phase" in out.stderr


def test_a_hook_in_a_script_read_from_stdin_runs_inline_with_a_word(
    light_server: S3TestServer,
) -> None:
    """Engine processes cannot import a ``__main__`` read from stdin: its hook runs in the
    trainer's engine, with the warning that says why, not a dead engine."""
    body = HOOK_SCRIPT
    out = subprocess.run(
        [sys.executable, "-", light_server.endpoint],
        input=body,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "which another process cannot import" in out.stderr
    assert out.stdout.strip() == "OK True 0"


def test_engines_import_the_package_the_parent_imported(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """A copy of the package put first on sys.path at run time (a checkout next to an
    installed version) is the one engine processes import too."""
    copy = tmp_path / "checkout"
    shutil.copytree(Path(al.__file__).parent, copy / "asyncloader")
    with (copy / "asyncloader" / "_decode" / "_image.py").open("a") as f:
        # One write(2) a line: the engines import it at once, and under PYTHONUNBUFFERED a
        # print() is a write per piece, which interleave ("COPY COPY 11 12").
        f.write("\nimport os as _os\n_os.write(1, f'COPY {_os.getpid()}\\n'.encode())\n")
    body = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(copy)!r})
        import asyncloader as al
        if __name__ == "__main__":
            with al.ImageLoader("s3://b/train/", batch_size=4,
                                decode=al.DecodeConfig(workers=2),
                                engine=al.EngineConfig(processes=2),
                                store=al.StoreConfig(options={{"endpoint_url": sys.argv[1]}})) as loader:
                # Batch i is engine i % 2's: two batches mean both engines decoded (and
                # imported the decoder) before the loader closes them.
                batches = iter(loader)
                next(batches), next(batches)
                print("PARENT", os.getpid(), flush=True)
        """
    )
    out = _run_script(tmp_path / "train.py", body, light_server)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    copies = {line.split()[1] for line in lines if line.startswith("COPY")}
    parent = next(line.split()[1] for line in lines if line.startswith("PARENT"))
    assert parent in copies
    assert len(copies) == 3, out.stdout  # the parent and its two engine processes


def test_engines_that_met_a_bad_file_exit_without_a_word(
    tmp_path: Path, jpeg_folder: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A decode error holds the frames it was raised in, and with them views of the ring: at
    # the engine's exit its segment must still close, without the interpreter printing
    # "Exception ignored ... BufferError" (as decode workers once did on every close of a
    # loader whose data had a damaged file).
    data = tmp_path / "data" / "cls"
    data.mkdir(parents=True)
    good = sorted(jpeg_folder.rglob("*.jpg"))[:6]
    for p in good:
        shutil.copy(p, data / p.name)
    (data / "damaged.jpg").write_bytes(good[0].read_bytes()[:3000])
    (data / "empty.jpg").write_bytes(b"")
    children_before = _children()  # the session's emulators
    with al.ImageLoader(
        (tmp_path / "data").as_uri() + "/",
        batch_size=4,
        engine=al.EngineConfig(processes=2),
        transform=al.RandomResizedCrop(32),
        decode=al.DecodeConfig(workers=2),
        errors=al.ErrorConfig(on_error="skip", max_failures=2),
    ) as loader:
        assert sum(len(labels) for _, labels in loader) == 6
        assert loader.stats().skipped == {"DecodeError": 2}
    # The engines have exited (what they printed is in this test's stderr).
    assert _children() <= children_before
    err = capfd.readouterr().err
    assert "BufferError" not in err and "Exception ignored" not in err, err
