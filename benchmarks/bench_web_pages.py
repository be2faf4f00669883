"""A class folder on nginx without a manifest: listed by its folder pages.

The folder: the demo's JPEGs in 10 class folders, no metadata file, served by nginx
(Debian's) with ``autoindex on``.  One loader epoch (labels from the folders, batches of
32, ``Resize(64)``, one loader in this process, an empty cache folder each time) in three
cases that alternate in each round, each on an nginx of its own:

* ``manifest`` — the baseline: a manifest with every key and size beside the folder
  (``asyncloader ls --write-manifest``'s), given as the store option ``manifest``;
* ``pages-json`` — no manifest, nginx's ``autoindex_format json``: its pages give every
  file's size, so nothing is asked but the pages and the images;
* ``pages-html`` — no manifest, nginx's HTML pages (``autoindex_exact_size on``, its
  default): each row's size is read from them, as from the JSON pages;
* ``pages-html-rounded`` — no manifest, nginx's HTML pages with ``autoindex_exact_size
  off``: a size of 10,000 bytes or more is rounded (``45K``) and not read, so such an
  image is HEAD-asked before it is read.

``--servers`` adds other servers of the test kit, each with two cases: ``<server>-manifest``
(the same manifest, its baseline) and ``<server>-pages`` (its own folder pages): lighttpd
(sizes rounded: a HEAD per image), Caddy (its JSON: sizes), Express's ``serve-index``
(JSON names alone, then its HTML: sizes; folder links without their slash) and Apache
(``mod_autoindex``: sizes rounded).

Printed per case (medians of the rounds): pages, HEADs and GETs per image (the server's
access log), the seconds to the first batch and to the end of the epoch with their ratios
to its server's manifest case in the same round (after one epoch not measured, for the
imports), the CPU seconds per image (this process and the engine processes it waited for;
the server's own are not counted) and the peak RSS.

Run: ``python benchmarks/bench_web_pages.py [--images 2000] [--rounds 3] [--servers
nginx,lighttpd,caddy,express,apache] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench_web_filters import round_medians

import asyncloader as al
from asyncloader.testing import (
    Apache,
    Caddy,
    Express,
    Lighttpd,
    Nginx,
    find_apache,
    find_caddy,
    find_express,
    find_lighttpd,
    find_nginx,
    make_jpeg_folder,
)
from asyncloader.testing._webserver import WebServer

NGINX_CASES = {
    "manifest": "",
    "pages-json": "autoindex on; autoindex_format json;",
    "pages-html": "autoindex on;",
    "pages-html-rounded": "autoindex on; autoindex_exact_size off;",
}
OTHERS: dict[str, tuple[Callable[[Path], WebServer], Callable[[], object]]] = {
    "lighttpd": (Lighttpd, find_lighttpd),
    "caddy": (Caddy, find_caddy),
    "express": (Express, find_express),
    "apache": (Apache, find_apache),
}


def _cases(servers: list[str]) -> dict[str, tuple[str, Callable[[Path], WebServer], bool]]:
    """Each case: its server's name (its group), how to start the server on a folder, and
    whether the loader is given the manifest."""
    cases: dict[str, tuple[str, Callable[[Path], WebServer], bool]] = {}
    for name in servers:
        if name == "nginx":
            if find_nginx() is None:
                raise SystemExit("nginx is not installed (apt-get install nginx-light)")
            for case, conf in NGINX_CASES.items():
                cases[case] = ("nginx", partial(Nginx, server=conf), case == "manifest")
            continue
        make, find = OTHERS[name]
        if find() is None:
            raise SystemExit(f"{name} is not installed (.ci/run installs it)")
        cases[f"{name}-manifest"] = (name, make, True)
        cases[f"{name}-pages"] = (name, make, False)
    return cases


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def keyed_site(root: Path, images: int) -> dict[str, int]:
    """``images`` of the demo's JPEGs in 10 class folders (``root/site/train``) with a
    manifest of their keys and sizes beside them (``site/train.jsonl``): each image's size
    by key."""
    folder = make_jpeg_folder(root / "site" / "train", images=images, classes=10)
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*.jpg")}
    rows = [{"key": k, "size": s} for k, s in sorted(files.items())]
    (root / "site" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return files


def _epoch(
    url: str,
    cache: Path,
    manifest: str | None,
    stats: list[al.Stats] | None = None,
    **store_options: str,
) -> tuple[float, float, float, int]:
    """One epoch (with ``store_options`` beside the manifest, if any): seconds to the first
    batch and to the end, CPU seconds, samples; the loader's ``stats()`` appended to
    ``stats`` where given."""
    options = {"manifest": manifest, **store_options} if manifest else dict(store_options)
    c0, t0 = _cpu(), time.perf_counter()
    first = None
    n = 0
    with al.ImageLoader(
        url,
        batch_size=32,
        transform=al.Resize(64),
        store=al.StoreConfig(options=options),
        cache_dir=cache,
    ) as loader:
        for images, _ in loader:
            first = first if first is not None else time.perf_counter() - t0
            n += len(images)
        if stats is not None:
            stats.append(loader.stats())
    return first or 0.0, time.perf_counter() - t0, _cpu() - c0, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--servers", default="nginx", help="comma-separated, of: nginx, " + ", ".join(OTHERS)
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cases = _cases(args.servers.split(","))
    root = Path(tempfile.mkdtemp(prefix="bench-web-pages-"))
    folder = make_jpeg_folder(root / "site" / "train", images=args.images, classes=10)
    files = {
        "/train/" + p.relative_to(folder).as_posix(): p.stat().st_size
        for p in folder.rglob("*.jpg")
    }
    manifest = root / "site" / "train.jsonl"  # beside the folder, as a user publishes one
    rows = [{"key": k.removeprefix("/train/"), "size": s} for k, s in sorted(files.items())]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    _, first_server, _ = next(iter(cases.values()))
    with first_server(root / "site") as server:  # not measured: the imports and first start
        _epoch(
            f"{server.endpoint}/train/", root / "cache-warm-up", f"{server.endpoint}/train.jsonl"
        )
    for r in range(args.rounds):
        for case in list(cases) if r % 2 == 0 else list(cases)[::-1]:
            _, make, with_manifest = cases[case]
            with make(root / "site") as server:
                given = f"{server.endpoint}/train.jsonl" if with_manifest else None
                first, total, cpu, n = _epoch(
                    f"{server.endpoint}/train/", root / f"cache-{case}-{r}", given
                )
            asked = server.answers()  # every answer, once it has stopped (lighttpd's lag)
            assert n == len(files), (case, n, len(files))
            count = Counter(a.method for a in asked if a.path in files)
            pages = sum(a.path.endswith("/") for a in asked)
            runs[case].append(
                {
                    "pages": pages,
                    "heads_per_image": count["HEAD"] / len(files),
                    "gets_per_image": count["GET"] / len(files),
                    "first_batch_s": first,
                    "epoch_s": total,
                    "cpu_ms_per_image": cpu / len(files) * 1e3,
                }
            )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cases": {}}
    print(
        f"{len(files)} images in 10 class folders on {args.servers}, one epoch from an empty "
        f"cache; medians of {args.rounds} rounds; peak RSS of this process {peak_mb:.0f} MB"
    )
    ratios = {what: f"{what}_x_manifest" for what in ("first_batch_s", "epoch_s")}
    medians: dict[str, dict[str, float]] = {}
    for group in dict.fromkeys(g for g, _, _ in cases.values()):
        mine = {c: runs[c] for c, (g, _, _) in cases.items() if g == group}
        base = "manifest" if group == "nginx" else f"{group}-manifest"
        medians.update(round_medians(mine, base, ratios))
    for case, med in medians.items():
        out["cases"][case] = med
        print(
            f"{case:18s} pages {med['pages']:.0f}, per image {med['heads_per_image']:.2f} HEAD "
            f"{med['gets_per_image']:.2f} GET; first batch {med['first_batch_s']:.2f} s "
            f"({med['first_batch_s_x_manifest']:.2f} x), epoch {med['epoch_s']:.2f} s "
            f"({med['epoch_s_x_manifest']:.2f} x); CPU {med['cpu_ms_per_image']:.2f} ms/image"
        )
    out["peak_rss_mb"] = peak_mb
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
