"""A filtered run over a caption folder on a web server (nginx): what the server is asked.

The folder: the demo's JPEGs with a ``metadata.jsonl`` at its root (a caption and a score
0-9 each, no sizes: a web server has no listing, so the file names the images), served by
nginx (Debian's; ``python -m http.server`` where nginx is not installed).  A loader with
``filters=[("score", ">=", 9)]`` (about 10 % kept) runs one epoch, from an empty cache
folder each time, in two cases that alternate in each round:

* ``sized-all`` — the listing sizes every image the metadata file names before filtering
  (a HEAD each: what a loader did before it asked only for what it reads; here the same
  store with its ``list_unsized`` hidden, so the loader takes ``list``);
* ``kept-only`` — today's loader: the images that the filter leaves out get no request.

Printed per case (medians of the rounds): HEADs and GETs per image kept and per image left
out (from nginx's access log), the seconds to the first batch and to the end of the epoch,
and their ratios to ``sized-all`` measured in the same round.

Run: ``python benchmarks/bench_web_filters.py [--images 2000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncloader as al
from asyncloader._stores._web import HttpStore
from asyncloader.testing import (
    Nginx,
    PythonHTTPServer,
    find_nginx,
    make_jpeg_folder,
    tree_cpu_seconds,
)


class SizedAll(HttpStore):
    """The web store as a loader listed it before: every image sized while listing."""

    list_unsized = None  # type: ignore[assignment]


def _site(images: int, root: Path) -> tuple[Path, dict[str, int]]:
    """The caption folder, and each image's score by its URL path."""
    folder = make_jpeg_folder(root / "jpegs", images=images, classes=10)
    paths = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    scores = {"/" + k: i % 10 for i, k in enumerate(paths)}
    rows = [{"file_name": k, "text": f"photo {i}", "score": i % 10} for i, k in enumerate(paths)]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder, scores


def timed_epoch(store: HttpStore, cache: Path, **options: Any) -> tuple[float, float, float, int]:
    """One epoch of a loader over ``store`` with the cache folder ``cache`` (``options``:
    its other keywords; its batches ``(images, labels, extras)``): seconds to the first
    batch, to the end, CPU seconds (this process and its children), samples delivered."""
    cpu0 = tree_cpu_seconds()
    t0 = time.perf_counter()
    first = None
    n = 0
    with al.ImageLoader(
        store.url, store=al.StoreConfig(object_store=store), cache_dir=cache, **options
    ) as loader:
        for images, _, _ in loader:
            first = first if first is not None else time.perf_counter() - t0
            n += len(images)
        cpu = tree_cpu_seconds() - cpu0
    return first or 0.0, time.perf_counter() - t0, cpu, n


def _epoch(store: HttpStore, cache: Path) -> tuple[float, float, int]:
    """One filtered epoch: seconds to the first batch, to the end, samples delivered."""
    filters = [("score", ">=", 9)]
    options = dict(batch_size=32, labels=None, transform=al.Resize(64), extras=("text",))
    first, total, _, n = timed_epoch(store, cache, filters=filters, **options)
    return first, total, n


def round_medians(
    runs: dict[str, list[dict[str, float]]], baseline: str, ratios: dict[str, str]
) -> dict[str, dict[str, float]]:
    """Each case's medians over its rounds, and for each figure of ``ratios`` the median
    of its ratio to ``baseline``'s in the same round, under the name ``ratios`` gives."""
    out = {}
    for case, rows in runs.items():
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        for what, name in ratios.items():
            med[name] = statistics.median(
                b[what] / a[what] for a, b in zip(runs[baseline], rows, strict=True)
            )
        out[case] = med
    return out


def epoch_medians(
    runs: dict[str, list[dict[str, float]]], what: str, rounds: int
) -> tuple[dict[str, dict[str, float]], float]:
    """Each case's medians against ``direct`` (its epoch's ratio as ``epoch_s_x_direct``)
    and this process's peak RSS [MB], after a heading that says ``what`` was read."""
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    medians = round_medians(runs, "direct", {"epoch_s": "epoch_s_x_direct"})
    print(
        f"{what}, one epoch from an empty cache; medians of {rounds} rounds; peak RSS of "
        f"this process {peak_mb:.0f} MB"
    )
    return medians, peak_mb


def print_epochs(
    medians: dict[str, dict[str, float]], width: int, counts: Callable[[dict[str, float]], str]
) -> None:
    """A line per case of :func:`epoch_medians`: what ``counts`` says of it, its epoch and
    that epoch's ratio to ``direct``, its CPU per image."""
    for case, med in medians.items():
        print(
            f"{case:{width}s} {counts(med)}; epoch {med['epoch_s']:.2f} s "
            f"({med['epoch_s_x_direct']:.2f} x); CPU {med['cpu_ms_per_image']:.2f} ms/image"
        )


def save_results(path: Path | None, args: argparse.Namespace, **figures: Any) -> None:
    """Write a run's ``figures`` and its arguments to ``path`` as JSON (None: nowhere)."""
    if path is not None:
        out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
        out.update(figures)
        path.write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-web-filters-"))
    folder, scores = _site(args.images, root)
    kept = sum(s >= 9 for s in scores.values())
    left = len(scores) - kept
    cases = {"sized-all": SizedAll, "kept-only": HttpStore}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    server_kind = Nginx if find_nginx() else PythonHTTPServer
    for r in range(args.rounds):
        for case in list(cases) if r % 2 == 0 else list(cases)[::-1]:
            with server_kind(folder) as server:
                store = cases[case](server.endpoint + "/")
                first, total, n = _epoch(store, root / f"cache-{case}-{r}")
                asked: list[tuple[str, str]] = (
                    [(a.method, a.path) for a in server.answers()]
                    if isinstance(server, Nginx)
                    else [(m, p) for m, p, _ in server.requests()]
                )
            assert n == kept, (case, n, kept)
            count = Counter((m, scores[p] >= 9) for m, p in asked if p in scores)
            runs[case].append(
                {
                    "heads_per_kept": count["HEAD", True] / kept,
                    "gets_per_kept": count["GET", True] / kept,
                    "heads_per_left_out": count["HEAD", False] / left,
                    "gets_per_left_out": count["GET", False] / left,
                    "first_batch_s": first,
                    "epoch_s": total,
                }
            )
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cases": {}}
    print(
        f"{len(scores)} images, {kept} kept by the filter, on {server_kind.__name__}; "
        f"medians of {args.rounds} rounds"
    )
    ratios = {"epoch_s": "epoch_x_sized_all", "first_batch_s": "first_batch_x_sized_all"}
    for case, med in round_medians(runs, "sized-all", ratios).items():
        out["cases"][case] = med
        print(
            f"{case:10s} per kept image: {med['heads_per_kept']:.2f} HEAD "
            f"{med['gets_per_kept']:.2f} GET; per image left out: "
            f"{med['heads_per_left_out']:.2f} HEAD {med['gets_per_left_out']:.2f} GET; "
            f"first batch {med['first_batch_s']:.2f} s ({med['first_batch_x_sized_all']:.2f} x), "
            f"epoch {med['epoch_s']:.2f} s ({med['epoch_x_sized_all']:.2f} x)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
