"""Images that a server redirects elsewhere: the cost of following the redirects.

A dataset hub often answers each file's URL with a redirect to a CDN's signed URL (a 302
with a ``?sig=`` query): every image costs two requests, one to the hub and one to the
CDN.  Two nginx servers (Debian's) on 127.0.0.1 serve the demo's JPEGs in 10 class
folders with a manifest of keys and sizes beside them: the "CDN" serves the files, the
"hub" answers every ``/train/`` URL with a 302 to the same path on the CDN.  One loader
epoch (batches of 32, ``Resize(64)``, an empty cache folder each time) in three cases
that alternate in each round:

* ``direct`` — the baseline: the CDN's URL, no redirect;
* ``redirected-lean`` — the hub's URL on the default client (the lean one), which
  follows each redirect itself;
* ``redirected-aiohttp`` — the hub's URL with ``http_client="aiohttp"``, which follows
  them in aiohttp.

Printed per case (medians of the rounds): the hub's and the CDN's requests per image
(their access logs), the epoch's seconds and its ratio to ``direct`` in the same round,
and the CPU seconds per image (this process and the engine processes it waited for; the
servers' own are not counted).

Run: ``python benchmarks/bench_redirects.py [--images 2000] [--rounds 3] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench_web_filters import epoch_medians, print_epochs, save_results
from bench_web_pages import _epoch, keyed_site

from asyncloader.testing import Nginx, find_nginx

CASES = ("direct", "redirected-lean", "redirected-aiohttp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if find_nginx() is None:
        raise SystemExit("nginx is not installed (apt-get install nginx-light)")
    root = Path(tempfile.mkdtemp(prefix="bench-redirects-"))
    files = keyed_site(root, args.images)
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    with Nginx(root / "site") as cdn:
        manifest = f"{cdn.endpoint}/train.jsonl"
        _epoch(f"{cdn.endpoint}/train/", root / "cache-warm-up", manifest)  # the imports
        for r in range(args.rounds):
            for case in CASES if r % 2 == 0 else CASES[::-1]:
                hop = f"location /train/ {{ return 302 {cdn.endpoint}$request_uri?sig=abc; }}"
                with Nginx(root / "site", server=hop) as hub:
                    before = len(cdn.answers())
                    url = f"{(cdn if case == 'direct' else hub).endpoint}/train/"
                    client = "aiohttp" if case.endswith("aiohttp") else "lean"
                    cache = root / f"cache-{case}-{r}"
                    _, seconds, cpu, n = _epoch(url, cache, manifest, http_client=client)
                    assert n == len(files), (case, n, len(files))
                    served = [a for a in cdn.answers()[before:] if a.path.startswith("/train/")]
                    sent = [a for a in hub.answers() if a.path.startswith("/train/")]
                runs[case].append(
                    {
                        "hub_requests_per_image": len(sent) / len(files),
                        "cdn_requests_per_image": len(served) / len(files),
                        "epoch_s": seconds,
                        "cpu_ms_per_image": cpu / len(files) * 1e3,
                    }
                )
    medians, peak_mb = epoch_medians(runs, f"{len(files)} images", args.rounds)
    print_epochs(
        medians,
        19,
        lambda med: (
            f"per image: hub {med['hub_requests_per_image']:.2f}, CDN "
            f"{med['cdn_requests_per_image']:.2f} requests"
        ),
    )
    save_results(args.json, args, cases=medians, peak_rss_mb=peak_mb)


if __name__ == "__main__":
    main()
