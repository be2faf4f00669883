"""Every block of README.md and docs/ marked ``<!-- runnable -->`` runs as written, against a
local S3 server that serves ``s3://bucket/train/`` (our light server, reached through
``AWS_ENDPOINT_URL`` as any AWS tool reaches an endpoint), each in a folder of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncloader.testing import TEST_ENV, S3TestServer

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"<!-- runnable -->\n```(?P<lang>bash|python)\n(?P<code>.*?)\n```", re.S)


def _blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 2
            found.append((f"{page.relative_to(ROOT)}:{line}", m["lang"], m["code"]))
    return found


BLOCKS = _blocks()


def test_the_pages_have_runnable_blocks() -> None:
    pages = {where.split(":")[0] for where, _, _ in BLOCKS}
    assert {"README.md", "docs/getting-started.md", "docs/cli.md"} <= pages
    # The test kit's page starts each emulator, fills a bucket and reads it, as a user would.
    kit = [code for where, _, code in BLOCKS if where.startswith("docs/testing.md")]
    for server in ("MotoServer()", "Azurite()", "GCSEmulator()"):
        assert any(server in code and "upload_folder(" in code for code in kit), server


@pytest.fixture(scope="module")
def bucket(jpeg_folder: Path) -> Iterator[S3TestServer]:
    with S3TestServer(load=jpeg_folder, bucket="bucket", prefix="train/") as server:
        yield server


@pytest.mark.parametrize(("where", "lang", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_block_runs_as_written(
    bucket: S3TestServer, tmp_path: Path, where: str, lang: str, code: str
) -> None:
    env = {**os.environ, **TEST_ENV, "AWS_ENDPOINT_URL": bucket.endpoint}
    bindir = str(Path(sys.executable).parent)  # the asyncloader command of this Python
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-"]
    out = subprocess.run(
        argv,
        input=code if lang == "python" else None,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"{where}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


def _sentences(text: str) -> set[str]:
    """The prose sentences of a page, of 12 words or more (code blocks and tables left out),
    with markup and spacing made plain."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    text = re.sub(r"[`*_\[\]()>#-]", " ", text)
    out = set()
    for sentence in re.split(r"(?<=[.:;!?])\s+", text):
        words = sentence.lower().split()
        if len(words) >= 12:
            out.add(" ".join(words))
    return out


def test_one_home_per_fact_between_readme_and_the_docs() -> None:
    """README is the front door: what it says, no docs page says again (it links there)."""
    readme = _sentences((ROOT / "README.md").read_text())
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert readme.isdisjoint(_sentences(page.read_text())), page.name


def test_commands_run_the_environment_s_own_torch() -> None:
    """A command to copy says ``python -m torch.distributed.run``: the ``torchrun`` first on
    the PATH may belong to another environment than the one asyncloader is installed in."""
    import re

    places = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    places += sorted((ROOT / "examples").glob("*.py"))
    bare = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in places
        for line in p.read_text().splitlines()
        if re.search(r"(^|[\s`])torchrun --", line)
    ]
    assert bare == []
