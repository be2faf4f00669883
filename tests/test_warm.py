"""asyncloader warm and the cache commands, with several processes on one cache folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncloader", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _object_keys(cache_dir: Path) -> set[str]:
    cache = al.ObjectCache(cache_dir)
    try:
        return {k.split("\x00")[1] for k in cache.entry_keys()}
    finally:
        cache.close()


def test_shards_cover_the_prefix_exactly_once(light_server: S3TestServer, tmp_path: Path) -> None:
    opts = {"endpoint_url": light_server.endpoint}
    a = al.warm("s3://b/train/", tmp_path / "a", shard=(0, 2), store_options=opts)
    b = al.warm("s3://b/train/", tmp_path / "b", shard=(1, 2), store_options=opts)
    assert a.warmed + b.warmed == N_IMAGES
    assert not a.failed and not b.failed
    keys_a, keys_b = _object_keys(tmp_path / "a"), _object_keys(tmp_path / "b")
    assert not keys_a & keys_b
    assert len(keys_a | keys_b) == N_IMAGES


def test_warm_from_inside_a_running_event_loop(light_server: S3TestServer, tmp_path: Path) -> None:
    """``asyncloader.warm`` in a notebook cell (an event loop already runs there) warms, as
    ``ImageLoader`` does, instead of failing on ``asyncio.run``."""
    import asyncio

    async def cell() -> al.WarmReport:
        return al.warm("s3://b/train/", tmp_path, store_options=opts)

    opts = {"endpoint_url": light_server.endpoint}
    report = asyncio.run(cell())
    assert report.warmed == N_IMAGES and not report.failed


def test_killed_warm_resumes_and_verifies_clean(light_server: S3TestServer, tmp_path: Path) -> None:
    light_server.set_faults({}, latency=0.1)
    cache_dir = tmp_path / "c"
    args = ["warm", "s3://b/train/", "--cache-dir", str(cache_dir)]
    args += ["--endpoint-url", light_server.endpoint]
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncloader", *args, "--max-inflight", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until some objects are in (packs and index)
        if (cache_dir / "objects").is_dir() and len(_object_keys(cache_dir)) >= 10:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(_object_keys(cache_dir))
    assert 0 < partial < N_IMAGES
    light_server.set_faults({}, latency=0.0)
    second = _cli(*args)
    assert second.returncode == 0, second.stderr
    assert f"{N_IMAGES - partial} objects warmed" in second.stdout
    assert f"{partial} already cached" in second.stdout
    verify = _cli("cache", "verify", str(cache_dir))
    assert verify.returncode == 0
    assert f"{N_IMAGES} objects checked, 0 damaged" in verify.stdout
    stats = _cli("cache", "stats", str(cache_dir))
    assert f"{N_IMAGES} objects" in stats.stdout


LOADER = textwrap.dedent(
    """
    import sys, asyncloader as al
    if __name__ == "__main__":
        index = {}
        with al.ImageLoader("s3://b/train/", batch_size=8, cache_dir=sys.argv[2],
                            decode=al.DecodeConfig(workers=1),
                            labels=lambda k: index.setdefault(k, len(index)), shuffle=False,
                            store=al.StoreConfig(options={"endpoint_url": sys.argv[1]})) as loader:
            for epoch in range(2):
                n = sum(len(lab) for _, lab in loader)
                assert n == len(index), (n, len(index))
            print("OK", loader.stats().cache_hits)
    """
)


def test_loaders_and_warm_share_one_cache(light_server: S3TestServer, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    script = tmp_path / "train.py"
    script.write_text(LOADER)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), light_server.endpoint, str(cache_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    warm = _cli(
        "warm",
        "s3://b/train/",
        "--cache-dir",
        str(cache_dir),
        "--endpoint-url",
        light_server.endpoint,
    )
    assert warm.returncode == 0, warm.stderr
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        assert out.startswith("OK")
    verify = _cli("cache", "verify", str(cache_dir))
    assert f"{N_IMAGES} objects checked, 0 damaged" in verify.stdout


def test_failed_objects_give_a_nonzero_exit(light_server: S3TestServer, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    args = ["warm", "s3://b/train/", "--cache-dir", str(cache_dir)]
    args += ["--endpoint-url", light_server.endpoint]
    assert _cli(*args, "--group-shared").returncode == 0  # also saves the listing beside it
    assert oct(cache_dir.stat().st_mode & 0o7777) == oct(0o2770)  # made for the group
    assert _cli("cache", "clear", str(cache_dir)).stdout.startswith(f"{N_IMAGES} objects removed")
    light_server.delete("b", "train/class_01/img_000005.jpg")
    again = _cli(*args)  # the saved listing still names the deleted object
    assert again.returncode == 1
    assert "1 failed" in again.stdout
    assert "class_01/img_000005.jpg" in again.stderr
    assert "not found" in again.stderr


def test_warm_names_the_images_a_metadata_file_names_that_the_store_lacks(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """A metadata file naming an image the bucket does not have: nothing to warm, and what
    a run that reads the file will report missing, so ``warm`` says so (every image that
    is there warmed, the exit status 0); a folder's file that is malformed, which a run
    would refuse at its start, is a failure naming its line."""
    rows = [{"file_name": f"class_00/img_{i:06d}.jpg", "caption": str(i)} for i in (0, 4, 8)]
    rows.append({"file_name": "class_00/gone.jpg", "caption": "not there"})
    rows.append({"file_name": "notes.md", "caption": "not an image: not ours to name"})
    light_server.put(
        "b", "train/metadata.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()
    )
    args = ["warm", "s3://b/train/", "--cache-dir", str(tmp_path / "c")]
    done = _cli(*args, "--endpoint-url", light_server.endpoint)
    assert done.returncode == 0, done.stderr
    assert f"{N_IMAGES} objects warmed" in done.stdout
    assert "1 named by the metadata files but not in the store" in done.stdout
    assert "  class_00/gone.jpg" in done.stderr.splitlines()
    light_server.put("b", "train/class_01/metadata.jsonl", b'{"file_name": "a.jpg"}\nnot json\n')
    opts = {"endpoint_url": light_server.endpoint}
    report = al.warm("s3://b/train/", tmp_path / "c", store_options=opts, refresh_listing=True)
    assert report.missing == ["class_00/gone.jpg"]  # the malformed file is not read
    assert [key for key, _ in report.failed] == ["class_01/metadata.jsonl"]
    assert report.failed[0][1].startswith("class_01/metadata.jsonl:2: not JSON")
    assert report.already_cached == N_IMAGES and report.warmed == 0


def test_warm_of_a_wrong_bucket_leaves_no_folder_behind(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """A warm that fails before anything is cached writes nothing: no empty cache folder
    (the listing failed), as a read-only command writes nothing."""
    opts = {"endpoint_url": light_server.endpoint}
    with pytest.raises(al.AsyncLoaderError):
        al.warm("s3://no-such-bucket/train/", tmp_path / "c", store_options=opts)
    assert not (tmp_path / "c").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there before stays
    with pytest.raises(al.AsyncLoaderError):
        al.warm("s3://no-such-bucket/train/", tmp_path / "kept", store_options=opts)
    assert (tmp_path / "kept").is_dir()


def test_bad_shard_is_refused() -> None:
    out = _cli("warm", "s3://b/x/", "--cache-dir", "/tmp/never", "--shard", "2/2")
    assert out.returncode == 1  # a usage error, as every user's mistake (docs/cli.md)
    assert "does not exist" in out.stderr


def test_warm_into_a_cache_too_small_keeps_the_loaders_subset(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """``warm`` of data three times the size of the cache: the fixed subset a
    loader keeps, nothing else, and the loader then reads that subset from disk."""
    opts = {"endpoint_url": light_server.endpoint}
    full = al.warm("s3://b/train/", tmp_path / "all", store_options=opts)
    total = al.ObjectCache(tmp_path / "all").stats().volume
    limit = total // 3
    report = al.warm("s3://b/train/", tmp_path / "c", cache_size=limit, store_options=opts)
    assert full.warmed == N_IMAGES and not report.failed
    assert 0 < report.warmed < N_IMAGES // 2
    assert report.warmed + report.not_admitted == report.listed == N_IMAGES
    assert "left out: the data does not fit the cache" in report.summary()
    warmed = _object_keys(tmp_path / "c")
    light_server.reset_stats()
    with al.ImageLoader(
        "s3://b/train/",
        batch_size=16,
        cache_dir=tmp_path / "c",
        cache=al.CacheConfig(size=limit),
        store=al.StoreConfig(options=opts),
    ) as loader:
        n = sum(len(labels) for _, labels in loader)
        stats = loader.stats()
    assert n == N_IMAGES
    assert stats.cache_hits >= len(warmed) and stats.cache_stored == 0
    fetched = {k[len("train/") :] for k in light_server.stats()["gets_by_key"]}
    assert not fetched & warmed
    assert _object_keys(tmp_path / "c") == warmed


def test_warm_and_loaders_keep_one_subset_for_any_number_of_ranks(
    light_server: S3TestServer, tmp_path: Path
) -> None:
    """Three ranks, unshuffled, one per node, each with a cache too small for its shard:
    ``warm --shard r/3`` keeps exactly the subset rank ``r``'s loader keeps (one admission
    rule from the same inputs), so the loader stores nothing and fetches nothing warm kept."""
    opts = {"endpoint_url": light_server.endpoint}
    al.warm("s3://b/train/", tmp_path / "all", store_options=opts)
    limit = al.ObjectCache(tmp_path / "all").stats().volume // 6  # half of a third
    for rank in range(3):
        folder = tmp_path / f"rank{rank}"
        report = al.warm(
            "s3://b/train/", folder, cache_size=limit, shard=(rank, 3), store_options=opts
        )
        assert report.listed == N_IMAGES // 3 and 0 < report.warmed < report.listed
        warmed = _object_keys(folder)
        light_server.reset_stats()
        with al.ImageLoader(
            "s3://b/train/",
            batch_size=8,
            shuffle=False,
            rank=rank,
            world_size=3,
            cache_dir=folder,
            cache=al.CacheConfig(size=limit),
            shard=al.ShardConfig(local_world_size=1),
            store=al.StoreConfig(options=opts),
        ) as loader:
            n = sum(len(labels) for _, labels in loader)
            stats = loader.stats()
            samples = loader.dataset.samples
        assert n == N_IMAGES // 3
        assert stats.cache_stored == 0, rank  # nothing admitted that warm left out
        assert stats.cache_hits >= len(warmed), rank  # (the next epoch's first batches too)
        # Fetched: exactly the rank's shard less what warm kept.
        fetched = {k[len("train/") :] for k in light_server.stats()["gets_by_key"]}
        shard = {s.obj.key for s in samples[rank::3]}
        assert fetched == shard - warmed, rank
