"""The command line as a new user meets it: ``--version``, every command's help, arguments
checked before any work, read-only commands that write nothing, and one message with exit
status 1 for every mistake a user can fix (a folder that is not a cache, a prefix that
names nothing, a folder with no images)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader._cli import main


def _tree(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` → its modification time: what a command wrote (SQLite's
    own journal files come and go with a connection: a folder's time may change)."""
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()
    }


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"asyncloader {al.__version__}"


@pytest.mark.parametrize("command", ["demo", "warm", "ls", "bench", "cache"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: asyncloader {command}")
    if command == "cache":
        for action, says in (("stats", "reads only"), ("verify", "CRC"), ("clear", "every")):
            line = next(x for x in out.splitlines() if x.strip().startswith(action + " "))
            assert says in line


@pytest.mark.parametrize("action", ["stats", "verify", "clear"])
def test_a_folder_that_is_not_a_cache_is_an_error_and_nothing_is_written(
    jpeg_folder: Path, tmp_path: Path, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    shutil.copytree(jpeg_folder, data)
    before = _tree(data)
    assert main(["cache", action, str(data)]) == 1
    err = capsys.readouterr().err
    assert f"{data} is not a cache folder" in err
    assert _tree(data) == before  # no objects/cache.db made inside the user's data


def test_a_missing_cache_folder_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "stats", str(tmp_path / "nowhere")]) == 1  # as every user error
    assert "no such folder" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_cache_stats_reads_a_cache_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = al.ObjectCache(tmp_path / "cache")
    cache.put("s3://b/\x00k\x00e", b"x" * 100_000)
    cache.close()
    before = _tree(tmp_path / "cache")
    assert main(["cache", "stats", str(tmp_path / "cache")]) == 0
    assert "1 objects" in capsys.readouterr().out
    assert _tree(tmp_path / "cache") == before
    assert al.ObjectCache(tmp_path / "cache").stats().entries == 1
    fresh = al.ObjectCache(tmp_path / "unused")
    assert fresh.stats().entries == 0
    assert not (tmp_path / "unused").exists()  # a read makes no folder


def test_demo_arguments_are_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for option, value in (("--batch-size", "0"), ("--images", "-3"), ("--epochs", "x")):
        with pytest.raises(SystemExit) as info:
            main(["demo", "--data-dir", str(tmp_path / "data"), option, value])
        assert info.value.code == 1  # a mistake the user can fix, as the CLI page says
        assert f"argument {option}" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # no JPEG made, no emulator started


def test_a_misspelled_option_is_exit_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["ls", "s3://b/x/", "--refrsh-listing"], ["cahce", "stats", "x"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 1
        assert "error:" in capsys.readouterr().err


def test_the_not_a_cache_error_names_options_that_exist(
    jpeg_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "stats", str(jpeg_folder)]) == 1
    err = capsys.readouterr().err
    assert "CacheConfig(dir=)" not in err and "cache_dir=" in err
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    assert "CacheConfig(dir=)" not in capsys.readouterr().out


def test_ls_of_a_prefix_that_names_nothing_says_where_to_look(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["ls", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "nothing is listed there. Is the prefix right?" in err
    (empty / "notes.txt").write_text("not an image")
    assert main(["ls", str(empty)]) == 1
    assert "1 objects listed, none of them with an image extension" in capsys.readouterr().err
    assert main(["ls", str(empty), "--all-objects"]) == 0


def test_bench_of_a_folder_without_images_is_a_clear_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("not an image")
    assert main(["bench", str(tmp_path), "--seconds", "2", "--no-disk"]) == 1
    err = capsys.readouterr().err
    assert "AsyncLoaderError: no samples under" in err
    assert "StoreError" not in err
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_bench_says_which_sampled_objects_do_not_decode(
    jpeg_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    shutil.copytree(jpeg_folder, data)
    bad = sorted(data.rglob("*.jpg"))[:2]
    for p in bad:
        p.write_bytes(b"not a jpeg")
    report = al.bench(str(data), seconds=2, sample=1000)
    names = {p.relative_to(data).as_posix() for p in bad}
    assert set(report.undecodable) == names
    assert report.decode_cpu_ms_per_image > 0
    assert f"2 of the {report.sample_objects} sampled objects do not decode" in report.summary()
