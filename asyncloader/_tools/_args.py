"""The command line's argument types and store options (checked by argparse, before any
work): whole numbers of at least 1, shards, ``-o KEY=VALUE`` store options."""

from __future__ import annotations

import argparse

__all__ = ["add_store_options", "parse_shard", "parse_store_option", "positive", "store_options"]


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
