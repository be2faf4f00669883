"""The command line's grammar: its commands and their options (:func:`command_line`), and
the argument types checked by argparse before any work: whole numbers of at least 1,
shards, ``-o KEY=VALUE`` store options; a URL as the commands print it
(:func:`shown_url`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from .._base._errors import shown_key

__all__ = [
    "add_store_options",
    "command_line",
    "parse_shard",
    "parse_store_option",
    "positive",
    "shown_url",
    "store_options",
]


def shown_url(url: str) -> str:
    """A URL given on the command line as the commands print it: a credential in it (a
    user and password, a token in its query) hidden."""
    return shown_key(url)


def positive(text: str) -> int:
    """An argument that must be a whole number of at least 1 (checked before any work)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_shard(text: str) -> tuple[int, int]:
    """``i/n`` → ``(i, n)``, a shard that exists."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard wants i/n (like 0/4), not {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"shard {text} does not exist: 0 <= i < n")
    return i, n


def parse_store_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` → ``(key, value)``: ``true``/``false`` a bool, a number a number, else
    the text (``region=eu-west-1``, ``requester_pays=true``, ``max_connections=512``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--store-option wants KEY=VALUE, not {text!r}")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def store_options(args: argparse.Namespace) -> dict[str, object]:
    """The store options the command line sets (``--endpoint-url``, ``--store-option``)."""
    options: dict[str, object] = dict(args.store_option or [])
    if args.endpoint_url:
        options["endpoint_url"] = args.endpoint_url
    return options


def add_store_options(command: argparse.ArgumentParser) -> None:
    """``--endpoint-url`` and ``-o KEY=VALUE``: a command that reads a store takes both."""
    command.add_argument(
        "--endpoint-url", default=None, help="an S3-compatible, Azure Blob or GCS endpoint"
    )
    command.add_argument(
        "-o",
        "--store-option",
        type=parse_store_option,
        action="append",
        metavar="KEY=VALUE",
        help="any option of the store (repeatable): region=eu-west-1, requester_pays=true, "
        "user_project=..., profile=..., anonymous=true, ca_bundle=ca.pem, ...",
    )


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but an argument error (an unknown option, a missing value) exits
    with status 1, as every error the user can fix does (the CLI page), not argparse's 2;
    its subcommands' parsers are of this kind too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def command_line(description: str, version: str, docs: str) -> argparse.ArgumentParser:
    """The parser of ``asyncloader``'s command line: ``demo``, ``warm``, ``ls``, ``bench``
    and ``cache``, each with its options (``docs``: where the pages are, for the help)."""
    parser = _Parser(
        prog="asyncloader",
        description=description,
        epilog=f"Each command's options: asyncloader COMMAND --help.  Docs: the CLI page "
        f"({docs}cli.md).",
    )
    parser.add_argument("--version", action="version", version=f"asyncloader {version}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="stream a generated JPEG folder from a local S3 emulator")
    demo.add_argument("--images", type=positive, default=2000, help="images to generate (2000)")
    demo.add_argument("--classes", type=positive, default=10, help="class folders (10)")
    demo.add_argument("--epochs", type=positive, default=3, help="epochs to stream (3)")
    demo.add_argument("--batch-size", type=positive, default=128, help="batch size (128)")
    demo.add_argument(
        "--decode-workers", type=positive, default=None, help="default: the CPU budget"
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--data-dir", default=os.path.join("cache", "demo-jpegs"), help="where JPEGs are made"
    )
    demo.add_argument(
        "--cache-dir",
        default=os.path.join("cache", "objects"),
        help="the local object cache: epochs after the first (and later runs) read from it",
    )
    demo.add_argument("--no-cache", action="store_true", help="stream every epoch from storage")
    demo.add_argument(
        "--store",
        choices=("s3", "azure"),
        default="s3",
        help="the emulator: moto_server (s3, default) or Azurite (azure, needs npm's azurite)",
    )
    warm = sub.add_parser(
        "warm", help="fill the local cache with the objects under a URL, resumably"
    )
    warm.add_argument(
        "url", nargs="+", help="s3://bucket/prefix/, az://..., a path (several: a mix)"
    )
    warm.add_argument("--cache-dir", required=True, help="the cache folder (local NVMe)")
    warm.add_argument(
        "--cache-size", help="most bytes to keep (500GB, 64GiB; default: as ImageLoader's)"
    )
    warm.add_argument(
        "--max-inflight",
        dest="max_inflight",
        type=int,
        default=None,
        help="requests in flight (default: 64 per CPU, at least 64)",
    )
    warm.add_argument(
        "--shard", type=parse_shard, default=None, help="i/n: this node's part (torchrun env)"
    )
    warm.add_argument(
        "--node-local-seed",
        type=int,
        default=None,
        metavar="SEED",
        help="warm node i/n's subset for shuffle='node' with this seed, not every n-th object",
    )
    add_store_options(warm)
    warm.add_argument("--refresh-listing", action="store_true", help="list the store again")
    warm.add_argument("--all-objects", action="store_true", help="not only image files")
    warm.add_argument(
        "--scaled-jpegs",
        action="store_true",
        help="also keep copies of JPEGs >= 1 MiB that decode at 1/4 and 1/8 scale to the same "
        "pixels from a fraction of the data (large photos decode several times faster)",
    )
    warm.add_argument(
        "--group-shared",
        action="store_true",
        help="make a missing cache folder for your group too (drwxrws---), not yours only",
    )
    ls = sub.add_parser("ls", help="objects, bytes, classes, sizes and extensions under a URL")
    ls.add_argument("url", nargs="+", help="s3://bucket/prefix/, az://..., a path (several: a mix)")
    ls.add_argument(
        "--cache-dir", default=None, help="read (and save) the listing saved in this cache"
    )
    add_store_options(ls)
    ls.add_argument("--refresh-listing", action="store_true", help="list the store again")
    ls.add_argument("--all-objects", action="store_true", help="count every object as a sample")
    ls.add_argument(
        "--no-metadata",
        action="store_true",
        help="do not read the metadata files (their rows, columns and the images they name)",
    )
    ls.add_argument(
        "--json", action="store_true", help="one JSON object (a line per URL), for scripts"
    )
    ls.add_argument(
        "--write-manifest",
        metavar="PATH_OR_URL",
        default=None,
        help="write the samples (key, ImageFolder label, size, ETag) there — a local file, "
        "or a URL next to the data (s3://, gs://, az://, file://) — as JSONL rows (.jsonl) "
        "or arrays (.npz, the fastest to read): a loader given it as labels= lists nothing",
    )
    bench = sub.add_parser(
        "bench",
        help="measure a bucket from this machine: latency, throughput against requests in "
        "flight, decode and disk rates; name the bound, predict images/s, print settings",
    )
    bench.add_argument("url", help="s3://bucket/prefix/, gs://..., az://..., a path, ...")
    bench.add_argument("--seconds", type=float, default=45.0, help="time budget (45)")
    bench.add_argument("--sample", type=int, default=256, help="objects sampled (256)")
    bench.add_argument(
        "--max-inflight", type=int, default=256, help="the most requests in flight tried (256)"
    )
    bench.add_argument(
        "--decode-workers", type=int, default=None, help="plan for this many (default: CPUs)"
    )
    bench.add_argument("--size", type=int, default=224, help="RandomResizedCrop size (224)")
    bench.add_argument(
        "--cache-dir",
        default=os.path.join("cache", "objects"),
        help="the cache folder whose disk is measured (a scratch cache inside, removed after)",
    )
    bench.add_argument("--no-disk", action="store_true", help="skip the disk measurement")
    add_store_options(bench)
    bench.add_argument("--plot", metavar="FILE.png", default=None, help="draw the results")
    bench.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    cache = sub.add_parser(
        "cache",
        help="inspect, check or empty a cache folder",
        description="Inspect, check or empty a cache folder (one that a loader's "
        "cache_dir= or warm --cache-dir filled).  A folder that is not a cache is "
        "an error; nothing is written to it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="actions:\n"
        "  stats   objects and bytes held (reads only)\n"
        "  verify  reads every entry, checks its length and CRC, and removes the damaged\n"
        "          ones, entries whose pack file is gone, and files no entry refers to\n"
        "  clear   removes every entry",
    )
    cache.add_argument("action", choices=("stats", "verify", "clear"), help="see below")
    cache.add_argument("dir", help="the cache folder")
    return parser
