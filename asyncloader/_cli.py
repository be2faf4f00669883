"""asyncloader: stream image folders from S3, GCS, Azure, HTTP or disk into PyTorch.

``asyncloader demo`` — the main job on an embedded default: generate (once) an ImageNet-like
JPEG folder from real photos, start ``moto_server`` (or Azurite, ``--store azure``) on
127.0.0.1, upload the folder, stream a few epochs through the loader with a progress bar,
and print a throughput summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from asyncloader import AsyncLoaderError, __version__
from asyncloader._tools._args import command_line, shown_url, store_options

__all__ = ["main"]

# The documentation's pages: the docs site is built from this folder of the source.
DOCS = "docs/"


def _demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import asyncloader as al

    # The demo data and its emulator bucket; the CPU of the loader's processes.
    from asyncloader.testing import demo_bucket, process_cpu_seconds, tree_cpu_seconds

    data_dir = Path(args.data_dir)
    emulator = "Azurite" if args.store == "azure" else "moto_server"
    print(
        f"preparing {args.images} JPEGs in {args.classes} classes under {data_dir} and "
        f"{emulator} with them ..."
    )
    t0 = time.perf_counter()
    with demo_bucket(
        data_dir, images=args.images, classes=args.classes, seed=args.seed, store=args.store
    ) as bucket:
        files = sorted(data_dir.rglob("*.jpg"))
        kb = sum(p.stat().st_size for p in files) / len(files) / 1e3
        print(f"ready in {time.perf_counter() - t0:.1f} s ({len(files)} files, {kb:.0f} KB each)")
        print(f"streaming {bucket.url} from {bucket.name} at {bucket.endpoint}")
        moto_cpu0 = process_cpu_seconds(bucket.pid)
        server = (bucket.pid,) if bucket.pid is not None else ()
        cpu0, wall0 = tree_cpu_seconds(exclude=server), time.perf_counter()
        with al.ImageLoader(
            bucket.url,
            batch_size=args.batch_size,
            transform=al.RandomResizedCrop(224),
            decode=al.DecodeConfig(workers=args.decode_workers),
            seed=args.seed,
            store=al.StoreConfig(options=bucket.store_options),
            cache_dir=None if args.no_cache else args.cache_dir,
        ) as loader:
            samples = 0
            for epoch in range(args.epochs):
                loader.set_epoch(epoch)
                # The epoch's mean rate (smoothing=0): batches the ring holds already arrive
                # at once, and a rate of the last few would show millions of images/s.
                with tqdm(
                    total=loader.num_samples, desc=f"epoch {epoch}", unit="img", smoothing=0
                ) as bar:
                    for images, *_ in loader:
                        samples += len(images)
                        bar.update(len(images))
            stats = loader.stats()
            # Every process of the loader, alive until it closes: this one and its engine
            # processes; not the emulator.
            cpu = tree_cpu_seconds(exclude=server) - cpu0
        wall = time.perf_counter() - wall0
        moto_cpu = process_cpu_seconds(bucket.pid) - moto_cpu0
    print()
    print(stats.summary())
    # One rate: the summary's first line says samples/s and MB/s over the loader's life.
    print(
        f"loader CPU: {cpu / samples * 1e3:.2f} ms per image, all its processes "
        f"({args.epochs} epochs of {len(files)} images, {os.cpu_count()} cores)"
    )
    per_get = moto_cpu / max(stats.requests, 1) * 1e3
    emulator_bound = moto_cpu > 0.5 * wall and stats.batches >= 20
    limited = (
        f"the storage emulator: {bucket.name} spends milliseconds of CPU on every request "
        "and shares this machine's cores with the decoders (a real cloud store does not)"
        if emulator_bound
        else stats.bound_in_words()
    )
    print(f"what limited this run: {limited}")
    if moto_cpu > 0.5 * wall:
        print(
            f"note: the emulator is the bound here: {bucket.name} used {moto_cpu:.1f} CPU-s "
            f"({per_get:.1f} ms per GET) on this {os.cpu_count()}-core machine, leaving the "
            "decode workers less CPU. Real cloud storage costs the client nothing of the "
            "sort; see benchmarks/ for figures against a light server."
        )
    return 0


def _warm(args: argparse.Namespace) -> int:
    # Several URLs: each warmed in turn (the sources of a mix), all of them even if one fails.
    return max([_warm_one(args, url) for url in args.url])


def _warm_one(args: argparse.Namespace, url: str) -> int:
    from tqdm import tqdm

    import asyncloader as al

    options = store_options(args)
    extra: dict[str, object] = {"extensions": None} if args.all_objects else {}
    print(f"listing {shown_url(url)} ...", file=sys.stderr)
    state: dict[str, object] = {}
    bar = tqdm(total=0, unit="obj", desc="warm", smoothing=0.05, dynamic_ncols=True)
    # Bytes received, when the fetching started (after the listing), the last postfix.
    received = [0.0, time.perf_counter(), 0.0]

    def rate() -> str:
        return f"{received[0] / max(time.perf_counter() - received[1], 1e-9) / 1e6:.1f} MB/s"

    def listed(todo: int, cached: int) -> None:
        state["cached"] = cached
        received[1] = received[2] = time.perf_counter()
        bar.reset(total=todo)
        bar.set_postfix_str(f"{cached} already cached")

    def one(nbytes: int) -> None:
        received[0] += nbytes
        bar.update()
        now = time.perf_counter()
        if now - received[2] > 0.5:
            received[2] = now
            bar.set_postfix_str(rate())

    try:
        report = al.warm(
            url,
            args.cache_dir,
            max_inflight=args.max_inflight,
            shard=args.shard,
            node_seed=args.node_local_seed,
            refresh_listing=args.refresh_listing,
            scaled_jpegs=args.scaled_jpegs,
            group_shared=args.group_shared,
            store_options=options,
            on_listed=listed,
            on_object=one,
            **({"cache_size": args.cache_size} if args.cache_size else {}),
            **extra,  # type: ignore[arg-type]
        )
        if received[0]:
            bar.set_postfix_str(rate(), refresh=False)  # the whole run's, shown by close()
    finally:
        bar.close()
    print(report.summary())
    if report.missing:
        _some_to_stderr(
            f"{len(report.missing)} images named by the metadata files are not in the store "
            "(a run that reads the files reports each missing):",
            report.missing,
        )
    if report.failed:
        _some_to_stderr(
            f"{len(report.failed)} objects failed:", [f"{k}: {e}" for k, e in report.failed]
        )
        return 1
    return 0


def _some_to_stderr(head: str, lines: list[str], most: int = 20) -> None:
    """``head``, then the first ``most`` of ``lines`` indented, and how many more."""
    print(head, file=sys.stderr)
    for line in lines[:most]:
        print(f"  {line}", file=sys.stderr)
    if len(lines) > most:
        print(f"  ... and {len(lines) - most} more", file=sys.stderr)


def _ls(args: argparse.Namespace) -> int:
    if args.write_manifest and len(args.url) > 1:
        print("asyncloader ls: --write-manifest writes one folder's: give one URL", file=sys.stderr)
        return 1
    # Several URLs (the sources of a mix): each described in turn.
    return max([_ls_one(args, url) for url in args.url])


def _ls_one(args: argparse.Namespace, url: str) -> int:
    import json

    import asyncloader as al

    options = store_options(args)
    extra: dict[str, object] = {"extensions": None} if args.all_objects else {}
    inv = al.describe(
        url,
        cache_dir=args.cache_dir,
        refresh_listing=args.refresh_listing,
        store_options=options,
        write_manifest=args.write_manifest,
        metadata=not args.no_metadata,
        **extra,  # type: ignore[arg-type]
    )
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(inv)))
    else:
        print(inv.summary())
    if inv.samples == 0:
        # Nothing a loader could read: a prefix that names nothing, or no image files.
        print(f"asyncloader ls: {inv.nothing_to_read()}", file=sys.stderr)
        return 1
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json

    import asyncloader as al

    if args.plot:
        al.BenchReport.check_plot()  # before the measurement, not after it
    options = store_options(args)
    if not args.json:
        print(
            f"measuring {shown_url(args.url)} for about {args.seconds:.0f} s ...", file=sys.stderr
        )
    report = al.bench(
        args.url,
        seconds=args.seconds,
        sample=args.sample,
        max_inflight=args.max_inflight,
        decode_workers=args.decode_workers,
        size=args.size,
        cache_dir=None if args.no_disk else args.cache_dir,
        store_options=options,
    )
    if args.plot:
        report.plot(args.plot)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        print(report.summary())
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def _cache_cmd(args: argparse.Namespace) -> int:
    from asyncloader import ObjectCache

    if not Path(args.dir).is_dir():
        print(f"asyncloader cache: no cache at {args.dir}: no such folder", file=sys.stderr)
        return 1
    if not ObjectCache.is_cache(args.dir):
        # Opening it would make an index inside someone's data: refuse, write nothing.
        print(
            f"asyncloader cache: {args.dir} is not a cache folder (no objects/cache.db in "
            "it): give the folder a loader's cache_dir= or --cache-dir names",
            file=sys.stderr,
        )
        return 1
    cache = ObjectCache(args.dir)
    if args.action == "stats":
        st = cache.stats()
        print(f"{st.directory}: {st.entries} objects, {st.volume / 1e9:.2f} GB")
    elif args.action == "verify":
        checked, dropped = cache.verify()
        print(f"{checked} objects checked, {dropped} damaged and removed")
    else:
        print(f"{cache.clear()} objects removed")
    cache.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = command_line(__doc__.split("\n")[0], __version__, DOCS).parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "warm":
            return _warm(args)
        if args.command == "cache":
            return _cache_cmd(args)
        if args.command == "ls":
            return _ls(args)
        if args.command == "bench":
            return _bench(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (AsyncLoaderError, ValueError, OSError, ImportError) as exc:
        # What the user can fix (a URL, an option, credentials, a bucket, a folder): the
        # message, not a traceback.  ASYNCLOADER_DEBUG=1 shows the traceback too.
        if os.environ.get("ASYNCLOADER_DEBUG"):
            raise
        print(f"asyncloader {args.command}: {_message(exc)}", file=sys.stderr)
        if isinstance(exc, AsyncLoaderError):
            print(
                f"  (what it means and what to do: the Errors page, {DOCS}errors.md)",
                file=sys.stderr,
            )
        return 1
    return 2  # pragma: no cover


def _message(exc: BaseException) -> str:
    """An error as one line per fact: its kind and message, then its notes (the stage, the
    attempts made)."""
    lines = [f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", [])]
    return "\n  ".join(lines)


if __name__ == "__main__":
    sys.exit(main())
