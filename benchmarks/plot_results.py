"""Draw the headline comparison (README and the docs' home page) from the JSON that the
benchmarks wrote: images/s against the peers at 20 ms (``bench_loader.py --json``) and under
a latency tail (``bench_tail.py --json``).

Run (the commands that made the committed figures are in ``benchmarks/RESULTS.md``)::

    python benchmarks/bench_loader.py --latencies 0.02 --json benchmarks/results/loader.json
    python benchmarks/bench_tail.py --images 1500 \\
        --cases baseline,tail-1pct-2s,peer-baseline,peer-tail-1pct-2s \\
        --json benchmarks/results/tail.json
    python benchmarks/plot_results.py   # -> docs/assets/results.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _rate(data: dict[str, Any], case: str) -> float:
    return float(data["medians"][case]["images_per_second"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loader", default=str(HERE / "results" / "loader.json"))
    p.add_argument("--tail", default=str(HERE / "results" / "tail.json"))
    p.add_argument("--out", default=str(HERE.parent / "docs" / "assets" / "results.png"))
    args = p.parse_args()
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "plot_results.py needs matplotlib: pip install 'asyncloader[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loader = json.loads(Path(args.loader).read_text())
    tail = json.loads(Path(args.tail).read_text())
    ceiling = max(_rate(loader, c) for c in loader["medians"] if c.startswith("ceiling"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))

    names = [
        "asyncloader\n(default: engine processes)",
        "DataLoader + boto3\n(4 workers)",
        "decode ceiling\n(bytes in RAM)",
    ]
    values = [
        _rate(loader, "asyncloader @20 ms"),
        _rate(loader, "DataLoader+boto3 @20 ms"),
        ceiling,
    ]
    colors = ["tab:blue", "tab:gray", "tab:olive"]
    bars = left.bar(names, values, color=colors)
    left.bar_label(bars, fmt="%.0f")
    left.set_ylabel("images/s")
    left.set_title("bench_loader.py: S3 at 20 ms to first byte", fontsize=11)

    groups = ["no tail", "1 % of requests +2 s"]
    ours = [_rate(tail, "baseline"), _rate(tail, "tail-1pct-2s")]
    peer = [_rate(tail, "peer-baseline"), _rate(tail, "peer-tail-1pct-2s")]
    xs = range(len(groups))
    w = 0.38
    b1 = right.bar([x - w / 2 for x in xs], ours, w, label="asyncloader", color="tab:blue")
    b2 = right.bar([x + w / 2 for x in xs], peer, w, label="DataLoader + boto3", color="tab:gray")
    right.bar_label(b1, fmt="%.0f")
    right.bar_label(b2, fmt="%.0f")
    right.set_xticks(list(xs), groups)
    right.set_ylabel("images/s")
    right.set_title("bench_tail.py: 20 ms, and 1 % of requests 2 s late", fontsize=11)
    for ax in (left, right):
        ax.set_ylim(0, max(ax.get_ylim()[1], 1) * 1.25)
        ax.spines[["top", "right"]].set_visible(False)
    right.legend(loc="upper center", ncol=2, frameon=False)
    fig.suptitle(
        f"RandomResizedCrop(224) batches of {loader['args']['batch_size']}, "
        f"{loader['machine']}; commit {loader['commit']}, {loader['date']}",
        fontsize=10,
    )
    fig.text(
        0.5,
        0.01,
        "Each panel is its own benchmark run (medians of interleaved rounds): the two "
        "asyncloader bars without a tail are the same case measured twice, and differ by "
        "the machine's run-to-run noise.",
        ha="center",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(args.out)


if __name__ == "__main__":
    main()
