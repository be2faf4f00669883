"""Errors a screen long (a user's first week): a mistake of the user's that an engine
process meets — a wrong bucket, a misspelled extras name, a corrupt JPEG under
``on_error="raise"`` — arrives as its own exception with its own message and the loader's
frames only (the engine's traceback kept as ``engine_traceback``); a fault of the loader's
own still shows the engine's traceback; the command line prints the same message."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import S3TestServer

SCRIPT = textwrap.dedent(
    """
    import sys
    import asyncloader as al

    def bad_label(key):  # a labels function with a bug: the loader's fault to show whole
        return {}[key]

    if __name__ == "__main__":
        case, url, endpoint = sys.argv[1:4]
        kw = {"batch_size": 4, "transform": al.CenterCrop(16)}
        if endpoint != "-":
            kw["store"] = al.StoreConfig(options={"endpoint_url": endpoint})
        if case == "extras":
            kw["extras"] = ("captoin",)
        if case == "internal":
            kw["labels"] = bad_label
        with al.ImageLoader(url, **kw) as loader:
            for _ in loader:
                pass
    """
)


@pytest.fixture(scope="module")
def data(jpeg_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("errors")
    good = root / "good" / "cat"
    good.mkdir(parents=True)
    files = sorted(jpeg_folder.rglob("*.jpg"))[:8]
    for p in files:
        shutil.copy(p, good / p.name)
    bad = root / "bad" / "cat"
    shutil.copytree(good, bad)
    (bad / "corrupt.jpg").write_bytes(files[0].read_bytes()[:2000])
    (root / "run.py").write_text(SCRIPT)
    return root


def _run(data: Path, case: str, url: str, endpoint: str = "-") -> str:
    done = subprocess.run(
        [sys.executable, str(data / "run.py"), case, url, endpoint],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    return done.stderr


def test_a_users_mistake_is_a_screen_long(data: Path) -> None:
    with S3TestServer(bucket="b") as srv:
        bucket = _run(data, "bucket", "s3://no-such-bucket/train/", srv.endpoint)
    extras = _run(data, "extras", str(data / "good"))
    jpeg = _run(data, "jpeg", str(data / "bad"))
    for err, cause in (
        (bucket, "asyncloader.ObjectNotFound: not found: s3://no-such-bucket/train/"),
        (extras, "ValueError: "),
        (jpeg, "asyncloader.DecodeError: "),
    ):
        lines = err.rstrip().splitlines()
        assert len(lines) <= 25, err
        assert cause in "\n".join(lines[-3:]), err
        assert "in engine process" not in err  # the engine's frames say nothing here
    assert "captoin" in extras
    assert "corrupt.jpg" in jpeg


def test_a_fault_of_the_loader_s_own_shows_the_engine_s_traceback(data: Path) -> None:
    err = _run(data, "internal", str(data / "good"))
    assert "KeyError" in err
    assert "in engine process" in err and "bad_label" in err  # where it broke, in the engine


def test_the_engine_s_traceback_stays_reachable(data: Path) -> None:
    with pytest.raises(al.DecodeError) as info:
        with al.ImageLoader(str(data / "bad"), batch_size=4, transform=al.CenterCrop(16)) as ld:
            for _ in ld:
                pass
    text = getattr(info.value, "engine_traceback", "")
    assert text.startswith("in engine process") and "Traceback" in text
    assert "in engine process" not in "".join(getattr(info.value, "__notes__", []))


def test_the_command_line_prints_the_same_message(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncloader._cli import main

    with S3TestServer(bucket="b") as srv:
        python = _run(data, "bucket", "s3://no-such-bucket/train/", srv.endpoint)
        code = main(["ls", "s3://no-such-bucket/train/", "--endpoint-url", srv.endpoint])
    assert code == 1
    first = capsys.readouterr().err.splitlines()[0]
    said = python.rstrip().splitlines()[-1].removeprefix("asyncloader.")
    assert first == f"asyncloader ls: {said}"
