"""How the SSD cache stores JPEG-sized values: pack files, a file per value, inside SQLite,
or FanoutCache shards; and what least-recently-used eviction would cost on every hit.

Cases, on the JPEGs of ``bench_cache.py`` (~110 KB), each process a fresh subprocess so its
CPU time is its own; 1 and 2 processes at once (two writer threads' processes, two ranks):

* write: every value stored, CPU per object and objects/s: ``packs`` is the cache itself
  (``ObjectCache.put_many``, 32 entries per index transaction, as its writer thread does);
  the others are diskcache ``set`` per value: as a file each (``disk_min_file_size`` 32 KB,
  written in one call into one of 256 folders, the cache's layout before packs), inside
  SQLite (1 MB), and as files in a ``FanoutCache`` of 8 shards;
* read: a verified hit (``get`` + length and CRC check) from each layout, and the loader's
  own path for files (one index query per 128 keys, then the file read straight);
* eviction: hits through ``get`` under ``least-recently-stored`` (a read) and
  ``least-recently-used`` (every hit also updates the row: a SQLite write).

Run: ``python benchmarks/bench_cache_store.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

LAYOUTS = {
    "packs": (32 * 1024, 0),
    "files": (32 * 1024, 1),
    "sqlite": (1 << 20, 1),
    "fanout8": (32 * 1024, 8),
}


def _file_disk() -> type:
    """diskcache's ``Disk`` writing a value file in one call into one of 256 folders (as
    diskcache writes it: line by line, into 65 536 folders, it costs three times more)."""
    import diskcache

    class Disk(diskcache.Disk):  # type: ignore[misc]
        def filename(self, key: Any = None, value: Any = None) -> tuple[str, str]:
            hex_name = os.urandom(16).hex()
            name = os.path.join(hex_name[:2], hex_name[2:] + ".val")
            return name, os.path.join(self._directory, name)

        def _write(self, full_path: str, iterator: Any, mode: str, encoding: Any = None) -> int:
            os.makedirs(os.path.dirname(full_path), exist_ok=True)
            with open(full_path, mode) as writer, iterator.getbuffer() as view:
                writer.write(view)
                return len(view)

    return Disk


def _open(directory: str, layout: str, policy: str = "least-recently-stored") -> Any:
    import diskcache

    min_file, shards = LAYOUTS[layout]
    options: dict[str, Any] = {
        "disk": _file_disk(),
        "size_limit": 10**12,
        "eviction_policy": policy,
        "disk_min_file_size": min_file,
        "statistics": False,
        "timeout": 60,
    }
    if shards > 1:
        return diskcache.FanoutCache(directory, shards=shards, **options)
    return diskcache.Cache(directory, **options)


def _values(folder: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted(Path(folder).rglob("*.jpg"))]


def case(kind: str, directory: str, layout: str, folder: str, part: str, policy: str) -> dict:
    """One process's share (``part`` = "i/n") of writing or reading every value."""
    i, n = (int(x) for x in part.split("/"))
    values = _values(folder)
    mine = list(range(i, len(values), n))
    if layout == "packs":
        return case_packs(kind, directory, values, mine)
    db = _open(directory, layout, policy)
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "write":
        for j in mine:
            v = values[j]
            db.set(f"k{j}", v, tag=zlib.crc32(v), retry=True)
    elif kind == "read":
        for j in mine:
            v, tag = db.get(f"k{j}", tag=True, retry=True)
            assert len(v) == len(values[j])
            assert zlib.crc32(v) == tag
    else:  # "located": the loader's path, one index query per batch, then the file
        from asyncloader._cache import ObjectCache

        _located(ObjectCache(Path(directory).parent), values, mine)
    return {"n": len(mine), "cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}


def case_packs(kind: str, directory: str, values: list[bytes], mine: list[int]) -> dict:
    """The cache itself: writes as its writer thread makes them, reads as decode workers."""
    from asyncloader._cache import ObjectCache

    cache = ObjectCache(Path(directory).parent, size_limit=10**12)
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "write":
        for b in range(0, len(mine), 32):
            cache.put_many([(f"k{j}", values[j]) for j in mine[b : b + 32]])
    elif kind == "read":
        for j in mine:
            assert cache.get(f"k{j}", len(values[j])) is not None
    else:
        _located(cache, values, mine)
    return {"n": len(mine), "cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}


def _located(cache: Any, values: list[bytes], mine: list[int]) -> None:
    """The loader's read path: one index query per batch of 128, then the bytes."""
    for b in range(0, len(mine), 128):
        keys = [f"k{j}" for j in mine[b : b + 128]]
        where = cache.locate(keys)
        for key, j in zip(keys, mine[b : b + 128], strict=True):
            at = where[key]
            assert at is not None
            assert cache.read(key, len(values[j]), at) is not None


def _together(kind: str, directory: str, layout: str, folder: str, procs: int, policy: str):
    """``procs`` processes at once; (objects/s, CPU ms per object)."""
    running = [
        subprocess.Popen(
            [sys.executable, __file__, "--case", kind, directory, layout, folder],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PART": f"{i}/{procs}", "POLICY": policy},
        )
        for i in range(procs)
    ]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in running]
    if any(p.returncode for p in running):
        raise RuntimeError(f"{kind} {layout} failed")
    n = sum(o["n"] for o in outs)
    return n / max(o["wall"] for o in outs), sum(o["cpu"] for o in outs) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--repeat", type=int, default=3, help="rounds of all cases")
    p.add_argument("--data-dir", default=str(ROOT / "cache" / "bench-jpegs"))
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        kind, directory, layout, folder = args.case
        out = case(kind, directory, layout, folder, os.environ["PART"], os.environ["POLICY"])
        print(json.dumps(out))
        return

    from asyncloader.testing._demo import make_jpeg_folder

    folder = str(make_jpeg_folder(args.data_dir, images=args.images, classes=10, seed=0))
    results: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    lrs, lru = "least-recently-stored", "least-recently-used"
    names = list(LAYOUTS)
    for rnd in range(args.repeat):
        k = rnd % len(names)
        for layout in names[k:] + names[:k]:  # each layout first in one round
            for procs in (1, 2):
                tmp = tempfile.mkdtemp(prefix="asyncloader-bench-", dir=ROOT / "cache")
                d = os.path.join(tmp, "objects")
                try:
                    w = _together("write", d, layout, folder, procs, lrs)
                    results.setdefault(("write", layout, str(procs)), []).append(w)
                    r = _together("read", d, layout, folder, procs, lrs)
                    results.setdefault(("read", layout, str(procs)), []).append(r)
                    if layout in ("files", "packs"):
                        loc = _together("located", d, layout, folder, procs, lrs)
                        where = f"{layout}, located"
                        results.setdefault(("read", where, str(procs)), []).append(loc)
                    if layout == "files":
                        lru_r = _together("read", d, layout, folder, procs, lru)
                        results.setdefault(("LRU hit", "files", str(procs)), []).append(lru_r)
                        results.setdefault(("LRS hit", "files", str(procs)), []).append(r)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\n{args.images} JPEGs (~110 KB), {os.cpu_count()} cores, {args.repeat} round(s), medians"
    )
    print(f"{'what':10s} {'layout':16s} {'procs':>5s} {'objects/s':>10s} {'CPU ms/obj':>11s}")
    for (what, layout, procs), runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{what:10s} {layout:16s} {procs:>5s} {rate:10.0f} {cpu:11.3f}")


if __name__ == "__main__":
    main()
