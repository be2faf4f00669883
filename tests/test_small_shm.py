"""Shared memory that never kills: in a container with Docker's default 64 MB ``/dev/shm``
(here a private mount namespace with a 64 MB tmpfs on ``/dev/shm``), a default loader at
``batch_size=256`` delivers the whole epoch exactly once (its rings are memfds, which the
size of ``/dev/shm`` does not bind), and where segments live in ``/dev/shm`` (macOS, or
no memfd) it fails before its first batch with an error that names the bytes needed, the
bytes free and the fix.  Never SIGBUS."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import asyncloader as al

    if __name__ == "__main__":
        endpoint = sys.argv[1]
        if sys.argv[3] == "posix":
            import asyncloader._base._shm as shm
            shm.USE_MEMFD = False  # the trainer's rings in /dev/shm
        batches = 0
        try:
            with al.ImageLoader("s3://b/train/", batch_size=256, shuffle=False,
                                engine=al.EngineConfig(processes=int(sys.argv[2])),
                                store=al.StoreConfig(options={"endpoint_url": endpoint})) as loader:
                keys = [s.obj.key for s in loader.dataset.samples]
                seen = []
                for images, labels in loader:
                    batches += 1
                    seen += labels.tolist()
            print(json.dumps({"delivered": len(seen), "keys": len(keys)}))
        except al.AsyncLoaderError as exc:
            print(json.dumps({"error": str(exc), "batches": batches}))
    """
)


def _namespaced(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``script args`` in a mount namespace of its own, with a 64 MB tmpfs on /dev/shm."""
    inner = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script}"
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", inner + ' "$@"', "sh", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def small_shm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs -o size=64m tmpfs /dev/shm && df -k /dev/shm"],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"no private /dev/shm here: {probe.stderr.strip()[:200]}")
    script = tmp_path_factory.mktemp("shm") / "run.py"
    script.write_text(SCRIPT)
    return script


COPIES = 6  # three batches of 256: rings that touch more than 64 MB


@pytest.fixture(scope="module")
def server(jpeg_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3TestServer]:
    folder = tmp_path_factory.mktemp("many")
    for i in range(COPIES):
        shutil.copytree(jpeg_folder, folder / f"copy{i}")
    with S3TestServer(load=folder, bucket="b", prefix="train/") as s:
        yield s


@pytest.mark.parametrize("engines", ["1", "2"])
def test_a_default_loader_in_a_64_mb_dev_shm_delivers_its_epoch(
    small_shm: Path, server: S3TestServer, engines: str
) -> None:
    result = _run(small_shm, server, engines, "memfd")
    assert result == {"delivered": N_IMAGES * COPIES, "keys": N_IMAGES * COPIES}


@pytest.mark.parametrize("engines", ["1", "2"])
def test_rings_in_a_64_mb_dev_shm_say_so_before_the_first_batch(
    small_shm: Path, server: S3TestServer, engines: str
) -> None:
    result = _run(small_shm, server, engines, "posix")
    assert result["batches"] == 0  # before the first batch
    message = result["error"]
    assert "MB of shared memory and /dev/shm has" in message
    assert "--shm-size" in message and "medium: Memory" in message


def _run(script: Path, server: S3TestServer, engines: str, segments: str) -> dict[str, Any]:
    out = _namespaced(script, server.endpoint, engines, segments)
    assert out.returncode == 0, out.stderr[-3000:]  # not -7 (SIGBUS), not a traceback
    assert "Bus error" not in out.stderr and "SIGBUS" not in out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
