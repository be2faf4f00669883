"""Images through a forward proxy: what the proxy costs the loader, on each HTTP client.

A company's network often puts a forward proxy (squid, tinyproxy) between a training node
and the store: ``HTTPS_PROXY=http://user:password@proxy:3128``, HTTPS through the tunnels
its ``CONNECT`` opens.  nginx (Debian's) on 127.0.0.1 serves the demo's JPEGs over HTTPS
(a private CA) in 10 class folders with a manifest of keys and sizes beside them;
tinyproxy (Debian's) asks for Basic credentials and lets tunnels through to nginx's port.
One loader epoch (batches of 32, ``Resize(64)``, an empty cache folder each time) in three
cases that alternate in each round:

* ``direct`` — the baseline: no proxy, the default client (the lean one);
* ``proxy-lean`` — through the proxy on the default client, its own TLS in the tunnel;
* ``proxy-aiohttp`` — through the proxy with ``http_client="aiohttp"`` (what every read
  through a proxy went on before the lean client spoke to proxies).

Printed per case (medians of the rounds): the tunnels the proxy opened, the epoch's
seconds and its ratio to ``direct`` in the same round, and the CPU seconds per image (this
process and the engine processes it waited for; nginx's and tinyproxy's own are not
counted).  ``--plain`` serves plain HTTP instead (requests to the proxy naming their URL,
no tunnels).

Run: ``python benchmarks/bench_proxy.py [--images 2000] [--rounds 3] [--plain] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench_web_filters import epoch_medians, print_epochs, save_results
from bench_web_pages import _epoch, keyed_site

from asyncloader.testing import Nginx, TinyProxy, find_nginx, find_tinyproxy

CASES = ("direct", "proxy-lean", "proxy-aiohttp")
USER, PASSWORD = "trainer", "bench-pr0xy"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="plain HTTP, not HTTPS")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if find_nginx() is None or find_tinyproxy() is None:
        raise SystemExit(
            "nginx or tinyproxy is not installed (apt-get install nginx-light tinyproxy-bin)"
        )
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        os.environ.pop(name, None)
        os.environ.pop(name.lower(), None)
    root = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    files = keyed_site(root, args.images)
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    with Nginx(root / "site", tls=not args.plain) as origin:
        manifest = f"{origin.endpoint}/train.jsonl"
        options = {} if args.plain else {"ca_bundle": str(origin.ca_file)}
        url = f"{origin.endpoint}/train/"
        port = int(origin.endpoint.rsplit(":", 1)[1])
        _epoch(url, root / "cache-warm-up", manifest, **options)  # the imports
        for r in range(args.rounds):
            for case in CASES if r % 2 == 0 else CASES[::-1]:
                with TinyProxy(credentials=(USER, PASSWORD), connect_ports=[port]) as proxy:
                    via = proxy.url() if case != "direct" else ""
                    client = "aiohttp" if case.endswith("aiohttp") else "lean"
                    cache = root / f"cache-{case}-{r}"
                    _, seconds, cpu, n = _epoch(
                        url, cache, manifest, **options, proxy=via, http_client=client
                    )
                    asked = proxy.requests()
                assert n == len(files), (case, n, len(files))
                if case != "direct":  # every request went through it
                    assert asked, case
                runs[case].append(
                    {
                        "tunnels": sum(1 for m, _ in asked if m == "CONNECT"),
                        "proxied_requests": len(asked),
                        "epoch_s": seconds,
                        "cpu_ms_per_image": cpu / len(files) * 1e3,
                    }
                )
    scheme = "HTTP" if args.plain else "HTTPS"
    medians, peak_mb = epoch_medians(runs, f"{len(files)} images over {scheme}", args.rounds)
    print_epochs(
        medians,
        14,
        lambda med: (
            f"tunnels {med['tunnels']:.0f}, requests seen by the proxy "
            f"{med['proxied_requests']:.0f}"
        ),
    )
    save_results(args.json, args, cases=medians, peak_rss_mb=peak_mb)


if __name__ == "__main__":
    main()
