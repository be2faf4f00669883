"""What crosses the process boundary between the training process and its engine
processes: the typed messages, and the one way an error crosses.

An engine process (:mod:`._child`) is a fresh interpreter started by
:func:`._launch.launch` and spoken to on one socket in frozen dataclasses, subclasses of
:class:`Message`::

    trainer                                   engine k
      │── EngineOrder (launch) ──────────────────►│ lists (the lead) or waits for
      │── TakeDataset (to k > 0, unless known) ──►│   the lead's dataset
      │◄──────── EngineReady | ChildFailed ───────│ built, producing epoch 0 (or
      │                                           │   where its order's start says)
      │◄──────── Listed (the lead, if it grew) ───│
      │── StartEpoch ────────────────────────────►│ restarts production
      │◄──────── Produced | ProductionFailed ─────│ one per batch, epoch end, failure
      │── AskCounters ───────────────────────────►│
      │◄──────── Counts ──────────────────────────│
      │── Stop ──────────────────────────────────►│ tears down
      │◄──────── Counts (final) ──────────────────│ exits; EOF either way means "gone"

Slots go back on a pipe of their own, not the socket: :data:`SLOT`, 4 bytes, written by
whichever thread drops a batch's last reference (one write, atomic, no lock: safe in a
finaliser).

Errors never cross raw: :meth:`CrossedError.of` turns an exception into a value that
always pickles, and :meth:`CrossedError.rebuild` on the other side gives back the exception
itself where it pickles both ways (type, message, attributes, notes), else an error of the
nearest class of ours (or of Python's) with its text; either way with the child's formatted
traceback as a note and the chain of errors it was raised from rebuilt the same way (cycles
guarded).  :func:`send` never raises for a message that cannot be pickled: the child reports
that as a :class:`ChildFailed` instead, so the parent always hears, never hangs.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import pickle
import struct
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from .._base import _errors
from .._base._shm import SegmentRef
from .._base._stats import Counters
from .._dataset._labels import Dataset
from .._run._notices import BatchReady, EpochEnd
from ._surface import EngineShare, EngineSpec

if TYPE_CHECKING:
    from .._run._build import LoaderPlan

__all__ = [
    "SLOT",
    "AskCounters",
    "ChildFailed",
    "Counts",
    "CrossedError",
    "EngineOrder",
    "EngineReady",
    "Listed",
    "Message",
    "OrderNotPicklable",
    "Produced",
    "ProductionFailed",
    "StartEpoch",
    "Stop",
    "TakeDataset",
    "send",
    "users_mistake",
    "without_frames",
]

_CHAIN_DEPTH = 16  # errors of a chain that cross; a longer chain is cut (said in the text)


class _Sends(Protocol):
    def send(self, obj: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Message:
    """Base of every message between a parent and one of its child processes."""


@dataclass(frozen=True, slots=True)
class Stop(Message):
    """Parent → child: tear down and exit."""


@dataclass(frozen=True, slots=True)
class CrossedError:
    """An exception on its way to another process (always pickles).

    Attributes:
        pickled: The exception pickled (its notes and attributes with it), or None where it
            does not pickle (an attribute holding a socket, a lock, a frame).
        kinds: Qualified names of its classes, most specific first.
        text: ``"Type: message"``, as the child saw it.
        trace: The child's formatted traceback, its chain included ("" for the errors of
            a chain: the first one's holds the whole chain).
        where: Which process it comes from (``"engine process 4242"``).
        cause: The error it was raised from (or while handling), crossed the same way.
        explicit: ``cause`` was ``raise ... from`` (``__cause__``), not ``__context__``.
    """

    pickled: bytes | None
    kinds: tuple[str, ...]
    text: str
    trace: str
    where: str
    cause: CrossedError | None = None
    explicit: bool = True

    @classmethod
    def of(cls, exc: BaseException, where: str) -> CrossedError:
        """``exc`` ready to cross, its tracebacks dropped (their frames hold views of shared
        memory that could then not be closed; their text travels in ``trace``).  A group's
        trace is its own: its members cross as themselves and print as they come back
        (each with its notes), not a second time inside the group's."""
        told = traceback.TracebackException.from_exception(exc)
        if isinstance(exc, BaseExceptionGroup):
            told.exceptions = None
        trace = "".join(told.format()).rstrip()
        chain: list[BaseException] = []
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen and len(chain) < _CHAIN_DEPTH:
            seen.add(id(e))
            chain.append(e)
            # The chain Python shows: a context that ``raise ... from None`` suppressed
            # does not cross (it may hold what the error's own text leaves out: a secret).
            e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
        without_frames(exc)
        crossed: CrossedError | None = None
        for i, e in enumerate(reversed(chain)):
            first = i == len(chain) - 1
            crossed = cls(
                pickled=_pickled(e),
                kinds=tuple(f"{k.__module__}.{k.__qualname__}" for k in type(e).__mro__),
                text=_text(e),
                trace=trace if first else "",
                where=where,
                cause=crossed,
                explicit=e.__cause__ is not None,
            )
        assert crossed is not None
        return crossed

    def rebuild(self) -> BaseException:
        """The exception again, as near to the child's as this process can make it; the
        child's traceback as a note — or, for a mistake of the user's
        (:func:`users_mistake`), kept as its ``engine_traceback`` attribute and not shown,
        unless ``ASYNCLOADER_DEBUG`` is set: its message says what to fix, and forty lines
        of the engine's frames between the loader's and that message said nothing."""
        exc = self._one()
        if self.trace:
            told = f"in {self.where}:\n{self.trace}"
            if users_mistake(exc) and not os.environ.get("ASYNCLOADER_DEBUG"):
                with contextlib.suppress(AttributeError):  # a class with __slots__: shown
                    exc.engine_traceback = told  # type: ignore[attr-defined]
                    told = ""
            if told:
                exc.add_note(told)
        crossed, e = self, exc
        while crossed.cause is not None:
            rebuilt = crossed.cause._one()
            if crossed.explicit:
                e.__cause__ = rebuilt
            else:
                e.__context__ = rebuilt
            crossed, e = crossed.cause, rebuilt
        return exc

    def _one(self) -> BaseException:
        if self.pickled is not None:
            try:
                exc = pickle.loads(self.pickled)
            except Exception as why:
                return self._stand_in(f"it could not be unpickled here: {why!r}")
            if isinstance(exc, BaseException):
                return exc
        return self._stand_in("it could not be pickled there")

    def _stand_in(self, why: str) -> BaseException:
        """An error of the nearest class this process knows that takes a message alone: one
        of ours, or one of Python's; else :class:`PipelineDeadError`."""
        message = f"{self.text} (raised in {self.where}; {why})"
        for kind in self.kinds:
            module, _, name = kind.rpartition(".")
            made = _message_only(module, name, message)
            if made is not None:
                return made
        return _errors.PipelineDeadError(message)


@dataclass(frozen=True, slots=True)
class ChildFailed(Message):
    """Child → parent: it could not start, or cannot go on (a message it could not send)."""

    error: CrossedError


def users_mistake(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's to fix, its message enough: an error of ours (a store
    that answered no, a bad sample, a listing with no samples, a failure budget) but a
    background part that broke (:class:`PipelineDeadError`), or a ``ValueError`` /
    ``TypeError`` (an option that cannot work).  Anything else is a fault of the loader's
    own, and keeps the child's traceback in sight."""
    if isinstance(exc, _errors.PipelineDeadError):
        return False
    return isinstance(exc, _errors.AsyncLoaderError | ValueError | TypeError)


def send(conn: _Sends, msg: Message, where: str) -> None:
    """Send ``msg``; one that cannot be pickled goes as the :class:`ChildFailed` that says
    why (the parent hears either way).

    Raises:
        OSError, EOFError, ValueError: the other side is gone (or the socket closed).
    """
    try:
        conn.send(msg)  # pickles first: nothing is written when that fails
    except (OSError, EOFError, ValueError):
        raise
    except Exception as exc:
        why = _errors.PipelineDeadError(f"{type(msg).__name__} could not be sent: {exc!r}")
        why.__cause__ = exc
        conn.send(ChildFailed(CrossedError.of(why, where)))


def without_frames(exc: BaseException) -> BaseException:
    """``exc`` and the errors chained to it without their tracebacks (cycles guarded).  A
    traceback holds the frames the error went through, and with them views of rings and
    arenas: segments that then cannot close at exit."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return exc


def _pickled(exc: BaseException) -> bytes | None:
    try:
        return pickle.dumps(exc)
    except Exception:
        return None


def _text(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "<its message could not be made>"
    name = type(exc).__qualname__
    return f"{name}: {message}" if message else name


# Our classes that take a message alone (FailureBudgetExceeded needs its failures).
_OURS = {
    name: cls
    for name, cls in vars(_errors).items()
    if isinstance(cls, type)
    and issubclass(cls, _errors.AsyncLoaderError)
    and not issubclass(cls, BaseExceptionGroup)
}


def _message_only(module: str, name: str, message: str) -> BaseException | None:
    cls: object = None
    if module in (_errors.__name__, "asyncloader"):  # our public ones say "asyncloader"
        cls = _OURS.get(name)
    elif module == "builtins":
        cls = getattr(builtins, name, None)
    if not isinstance(cls, type) or not issubclass(cls, Exception):
        return None
    if issubclass(cls, BaseExceptionGroup):
        return None
    try:
        return cls(message)
    except Exception:
        return None


# --- the engine's messages --------------------------------------------------------------

SLOT = struct.Struct("=i")
"""A slot given back: its number, on the engine's slot pipe."""


@dataclass(frozen=True, slots=True)
class TakeDataset(Message):
    """Trainer → engine ``k > 0``: the lead engine's listing, instead of listing again."""

    dataset: Dataset


@dataclass(frozen=True, slots=True)
class StartEpoch(Message):
    """Trainer → engine: make ``epoch`` from batch ``first`` on (``span``: positions of its
    order left to deal); what it makes from now on carries ``generation``."""

    generation: int
    epoch: int
    first: int
    span: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class AskCounters(Message):
    """Trainer → engine: send your counters."""


@dataclass(frozen=True, slots=True)
class EngineReady(Message):
    """Engine → trainer: built and producing into the ring the trainer made for it;
    ``dataset``: the lead's listing when complete already."""

    dataset: Dataset | None


@dataclass(frozen=True, slots=True)
class Listed(Message):
    """Engine (the lead) → trainer: a listing that grew while batches were made is complete
    (``dataset``), or failed (``error``)."""

    dataset: Dataset | None
    error: CrossedError | None


@dataclass(frozen=True, slots=True)
class Produced(Message):
    """Engine → trainer: a batch ready, or an epoch's end, made for ``generation``."""

    generation: int
    notice: BatchReady | EpochEnd


@dataclass(frozen=True, slots=True)
class ProductionFailed(Message):
    """Engine → trainer: production for ``generation`` stopped with ``error``."""

    generation: int
    error: CrossedError


@dataclass(frozen=True, slots=True)
class Counts(Message):
    """Engine → trainer: its counters (asked for, or the final ones as it stops)."""

    counters: Counters


@dataclass(frozen=True, slots=True)
class EngineOrder:
    """What an engine process is told to do (pickled once, at its start).

    Attributes:
        spec: What it reads and how (its share of the plan).
        share: Its share of the batches, and where its budget and ring live.
        await_dataset: Wait for the lead engine's dataset (:class:`TakeDataset`) instead of
            listing (every engine but the first, when the list is not known yet).
        release_fd: The pipe the trainer gives slots back on.
        start: Where production starts, and the generation it is made for (a replacement
            starts where its dead predecessor stopped); None: epoch 0 from its first batch.
    """

    spec: EngineSpec
    share: EngineShare
    await_dataset: bool
    release_fd: int
    start: StartEpoch | None = None

    @classmethod
    def parts(
        cls, spec: EngineSpec, plans: Sequence[LoaderPlan], budget_folder: str | None
    ) -> list[EngineOrder]:
        """The orders of ``len(plans)`` engine processes sharing ``spec``: engine ``k`` its
        plan and its batches; all but the first wait for the lead's dataset unless the
        objects are known; streaming with one engine only.  Each names its slot pipe and
        ring when it is pickled (:meth:`pickled`)."""
        n = len(plans)
        return [
            cls(
                spec=replace(spec, plan=plans[k], stream=spec.stream and n == 1),
                share=EngineShare(part=(k, n), budget_folder=budget_folder),
                await_dataset=k > 0 and spec.objects is None,
                release_fd=-1,
            )
            for k in range(n)
        ]

    def pickled(self, release_fd: int, ring: SegmentRef, serial: int) -> bytes:
        """This order for the engine that reads its slots from ``release_fd`` and fills
        ``ring``, known to the trainer by ``serial``, pickled.

        Raises:
            OrderNotPicklable: an option cannot be sent to an engine process.
        """
        share = replace(self.share, ring=ring, serial=serial)
        order = replace(self, release_fd=release_fd, share=share)
        try:
            data = pickle.dumps(order)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise OrderNotPicklable(str(exc)) from exc
        if b"__main__" in data and not _main_importable():
            raise OrderNotPicklable(
                "it names a function of the script's __main__, which another process "
                "cannot import (a script read from stdin or given with -c, or a notebook)"
            )
        return data


def _main_importable() -> bool:
    """Whether another process can import this one's ``__main__`` as ``spawn`` does: a
    module run with ``-m``, or a script file that exists."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return True
    path = getattr(main, "__file__", None)
    return isinstance(path, str) and os.path.isfile(path)


class OrderNotPicklable(Exception):
    """An option of the loader (a hook, a labels function) cannot go to another process."""
