"""Images through a forward proxy that serves a limited number of clients at once.

A proxy counts its clients: tinyproxy's ``MaxClients`` (100 in its sample configuration,
20 in openSUSE's), squid's ``maxconn`` rules.  Past its limit it leaves a new connection in
its listen queue, unanswered, until one of the connections it serves closes — and a client
that keeps its connections alive holds those places.  This reads an epoch of the demo's
JPEGs from nginx over HTTPS, through tinyproxy (Debian's) with ``MaxClients`` set to each
of ``--max-clients``, and straight from nginx (``direct``, the baseline), the cases
alternating in each round, one loader each (its default engine processes), a cache folder
of its own each time.

Printed per case (medians of the rounds): seconds to the first batch and to the epoch's
end, the epoch's time as a multiple of ``direct``'s, the tunnels the proxy opened, the
requests the loader retried, and the CPU milliseconds per image of the loader's process
and its engines (their start included); the peak RSS of this process.  An epoch that
passes ``--timeout`` is stopped and shown as such.

To measure another source tree (the code before a change, say), run this script with that
tree first on ``PYTHONPATH`` and as the working directory; where its
``asyncloader.testing.TinyProxy`` takes no ``max_clients``, the script sets ``MaxClients``
in the configuration it writes.

Run: ``python benchmarks/bench_proxy_clients.py [--images 400] [--rounds 3]
[--max-clients 8,20,100] [--timeout 240] [--http-client lean|aiohttp] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_web_pages import _epoch as epoch
from bench_web_pages import keyed_site

import asyncloader as al
from asyncloader.testing import Nginx, TinyProxy

USER, PASSWORD = "trainer", "pr0xy-s3cr3t"


def _proxy(port: int, max_clients: int) -> TinyProxy:
    """tinyproxy letting tunnels through to ``port``, serving ``max_clients`` at once."""
    if "max_clients" in inspect.signature(TinyProxy).parameters:
        return TinyProxy(
            credentials=(USER, PASSWORD), connect_ports=[port], max_clients=max_clients
        )
    # An older TinyProxy: its configuration's MaxClients line, set as it is written.
    original = Path.write_text

    def write_text(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        if self.name == "tinyproxy.conf":
            text = text.replace("MaxClients 256", f"MaxClients {max_clients}")
        return original(self, text, *args, **kwargs)

    class Limited(TinyProxy):
        def start(self) -> None:
            Path.write_text = write_text  # type: ignore[method-assign]
            try:
                super().start()
            finally:
                Path.write_text = original  # type: ignore[method-assign]

    return Limited(credentials=(USER, PASSWORD), connect_ports=[port])


def _epoch(url: str, cache: Path, options: dict[str, str], out: Any) -> None:
    """One epoch, in a process of its own (so that a stuck one can be stopped): its figures
    sent on ``out``."""
    stats: list[al.Stats] = []
    rest = {k: v for k, v in options.items() if k != "manifest"}
    first, seconds, cpu, n = epoch(url, cache, options["manifest"], stats, **rest)
    retries = sum(stats[0].retries.values())
    out.send(
        {"first_batch_s": first, "epoch_s": seconds, "cpu_s": cpu, "images": n, "retries": retries}
    )


def _timed(url: str, cache: Path, options: dict[str, str], timeout: float) -> dict[str, Any]:
    """:func:`_epoch` in a child process, stopped past ``timeout`` seconds."""
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_epoch, args=(url, cache, options, there))
    proc.start()
    there.close()  # the child's end: the pipe ends with the child
    try:
        got = here.recv() if here.poll(timeout) else None
    except EOFError:  # the child died: its error is on stderr
        got = {"failed": proc.exitcode}
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return got if got is not None else {"timed_out": timeout}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-clients", default="8,20,100")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--http-client", default="lean", help="the store option http_client")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        os.environ.pop(name, None)
        os.environ.pop(name.lower(), None)
    limits = [int(x) for x in args.max_clients.split(",")]
    cases = ["direct"] + [f"MaxClients {m}" for m in limits]
    root = Path(tempfile.mkdtemp(prefix="bench-proxy-clients-"))
    files = keyed_site(root, args.images)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    with Nginx(root / "site", tls=True) as origin:
        port = int(origin.endpoint.rsplit(":", 1)[1])
        url = f"{origin.endpoint}/train/"
        base = {
            "manifest": f"{origin.endpoint}/train.jsonl",
            "ca_bundle": str(origin.ca_file),
            "http_client": args.http_client,
        }
        for r in range(args.rounds):
            for case in cases if r % 2 == 0 else cases[::-1]:
                cache = root / f"cache-{len(cases) * r + cases.index(case)}"
                if case == "direct":
                    runs[case].append(_timed(url, cache, base, args.timeout))
                    continue
                with _proxy(port, int(case.split()[1])) as proxy:
                    got = _timed(url, cache, {**base, "proxy": proxy.url()}, args.timeout)
                    got["tunnels"] = sum(1 for m, _ in proxy.requests() if m == "CONNECT")
                runs[case].append(got)
    print(
        f"{len(files)} images over HTTPS from nginx, {args.http_client} client, "
        f"{args.rounds} rounds (medians)"
    )
    direct = [x["epoch_s"] for x in runs["direct"] if "epoch_s" in x]
    base_s = statistics.median(direct) if direct else float("nan")
    table: dict[str, Any] = {}
    for case in cases:
        done = [x for x in runs[case] if "epoch_s" in x]
        stuck = sum(1 for x in runs[case] if "timed_out" in x)
        failed = sum(1 for x in runs[case] if "failed" in x)
        if failed:
            print(f"{case:16s} {failed} epoch(s) failed (their errors above)")
        if not done:
            print(f"{case:16s} no epoch finished within {args.timeout:.0f} s")
            table[case] = {"timed_out": stuck}
            continue
        med = {k: statistics.median(x[k] for x in done) for k in done[0] if k != "images"}
        med["cpu_ms_per_image"] = med["cpu_s"] / len(files) * 1e3
        med["x_direct"] = med["epoch_s"] / base_s
        med["timed_out"] = stuck
        table[case] = med
        print(
            f"{case:16s} first batch {med['first_batch_s']:6.2f} s, epoch {med['epoch_s']:6.2f} s "
            f"({med['x_direct']:5.2f} × direct), tunnels {med.get('tunnels', 0):4.0f}, "
            f"retries {med['retries']:4.0f}, CPU {med['cpu_ms_per_image']:.2f} ms per image"
            + (f", {stuck} epoch(s) past {args.timeout:.0f} s" if stuck else "")
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:.0f} MB (each epoch ran in a process of its own)")
    if args.json:
        figures = {"args": vars(args), "package": al.__file__, "cases": table, "runs": runs}
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
