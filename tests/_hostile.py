"""Errors that cannot cross a process boundary as themselves, and the hooks that raise them.

At module level: engine processes and decode workers import this module to unpickle the
hooks (the tests' root is on their ``sys.path``, as it is on the trainer's).
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass
from typing import Any

import asyncloader as al
from asyncloader._decode._transforms import Plan


class Unpicklable(Exception):
    """Holds a lock (as an error holding a socket or a client would): pickling it fails."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class Ununpicklable(Exception):
    """Takes two arguments, as botocore's errors do: it pickles, but unpickling calls it
    with one and fails."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class UnunpicklableDecodeError(al.DecodeError):
    """A decode error of a hook's own that unpickles no more than :class:`Ununpicklable`:
    decode workers send it back as itself."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(why, key=key)


KINDS = ("unpicklable", "ununpicklable", "ununpicklable-decode")


def hostile(kind: str, where: str) -> Exception:
    """An error of ``kind`` whose message names ``where``."""
    text = f"hostile {kind} error from {where}"
    if kind == "unpicklable":
        return Unpicklable(text)
    if kind == "ununpicklable":
        return Ununpicklable(text, 7)
    return UnunpicklableDecodeError("some/key.jpg", text)


def failing_label(kind: str, key: str) -> int:
    """A ``labels=`` function (bound with functools.partial) that fails on the first key."""
    raise hostile(kind, "labels")


_plans = 0  # plans made in this process


@dataclass(frozen=True)
class FailingCrop:
    """A center-crop-like transform that raises ``kind`` from its ``after``-th plan on
    (counted in the process that decodes)."""

    kind: str
    after: int
    size: int = 24

    @property
    def output_size(self) -> tuple[int, int]:
        return (self.size, self.size)

    def plan(self, width: int, height: int, rng: random.Random) -> Plan:
        global _plans
        _plans += 1
        if _plans > self.after:
            raise hostile(self.kind, "a transform")
        side = min(width, height)
        left, top = (width - side) / 2, (height - side) / 2
        return Plan((left, top, left + side, top + side), (self.size, self.size), False)


def _made_in(pid: int, kind: str) -> OnlyHere:
    if os.getpid() != pid:
        raise hostile(kind, "unpickling a transform")
    return OnlyHere(kind)


@dataclass(frozen=True)
class OnlyHere:
    """A transform that cannot be unpickled in another process: a child's order fails."""

    kind: str

    @property
    def output_size(self) -> tuple[int, int]:
        return (24, 24)

    def plan(self, width: int, height: int, rng: random.Random) -> Plan:
        return Plan((0, 0, width, height), (24, 24), False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_made_in, (os.getpid(), self.kind))
