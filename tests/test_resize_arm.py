"""The resize extension's NEON kernels (AArch64: Grace and Graviton nodes, Apple silicon),
checked on this x86 machine: ``tests/c/resize_kernels.c`` (every kernel a CPU runs against
the scalar one, which ``test_resize.py`` holds to Pillow's pixels, on images that end
where an unreadable page begins) built for AArch64 by the cross compiler and run under
``qemu-aarch64``; and the same program built for this machine, for its own kernels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from asyncloader._decode._image import FAST_RESIZE

HERE = Path(__file__).parent
PROGRAM = HERE / "c" / "resize_kernels.c"
CROSS = "aarch64-linux-gnu-gcc"
INCLUDE = sysconfig.get_paths()["include"]  # Python.h: the extension's source includes it

pytestmark = pytest.mark.skipif(
    not (Path(INCLUDE) / "Python.h").exists(),
    reason="Python's headers are not installed (the extension is not built either)",
)


def _build_and_run(compiler: str, runner: list[str], out: Path, cases: int) -> str:
    """``PROGRAM`` built statically by ``compiler`` (the extension's own flags: -O3), run
    by ``runner``; its one line.  The Python API the extension's entry points call is never
    called here: those symbols are left unresolved."""
    build = [compiler, "-O3", "-static", f"-I{INCLUDE}", "-o", str(out), str(PROGRAM), "-lm"]
    made = subprocess.run(
        [*build, "-Wl,--unresolved-symbols=ignore-all"], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-3000:]
    ran = subprocess.run([*runner, str(out), str(cases)], capture_output=True, text=True)
    assert ran.returncode == 0, (ran.returncode, ran.stdout, ran.stderr[-3000:])
    return ran.stdout.strip()


@pytest.mark.skipif(
    (shutil.which(CROSS) is None or shutil.which("qemu-aarch64") is None)
    and not os.environ.get("ASYNCLOADER_REQUIRE_ARM"),
    reason=f"{CROSS} and qemu-aarch64 are not installed (apt-get install "
    "gcc-aarch64-linux-gnu qemu-user; .ci/run installs them)",
)
def test_the_neon_kernels_give_the_scalar_kernel_s_pixels(tmp_path: Path) -> None:
    line = _build_and_run(CROSS, ["qemu-aarch64"], tmp_path / "kernels-arm", 3000)
    # Kernel 1 is NEON there: 3,000 random cases, 3- and 4-byte pixels, both pass orders.
    assert line == "kernels 1 cases 3000 equal", line


@pytest.mark.skipif(
    sys.platform != "linux"
    or os.uname().machine != "x86_64"
    or shutil.which("gcc") is None
    or not FAST_RESIZE,
    reason="x86-64 Linux with gcc (a static build), the extension built",
)
def test_the_program_checks_this_machine_s_kernels_too(tmp_path: Path) -> None:
    # Here it runs SSE4.1 and AVX2 against the scalar kernel: the program's own check that
    # it compares kernels, not one with itself (test_resize.py holds each to Pillow).
    from asyncloader._decode import _resize  # type: ignore[attr-defined]

    line = _build_and_run("gcc", [], tmp_path / "kernels", 1000)
    assert line == f"kernels {_resize.SIMD} cases {1000 * _resize.SIMD} equal", line
