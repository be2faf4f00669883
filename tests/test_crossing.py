"""Errors cross every process boundary and always arrive (``_base/_wire.py``): the type and
message where the error pickles both ways, its text and the child's traceback where it does
not, the chain it was raised from kept, cycles guarded; at start-up and mid-epoch, from
engine processes, with ``timeout=None``."""

from __future__ import annotations

import functools
import pickle
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import asyncloader as al
from asyncloader._loader._wire import CrossedError, without_frames
from asyncloader.testing import S3TestServer

from ._hostile import FailingCrop, OnlyHere, Unpicklable, failing_label, hostile

SOON = 30.0  # [seconds]: "within seconds", far under the suite's 120 s per test


def _crossed(exc: BaseException) -> BaseException:
    """``exc`` raised in a child, sent and rebuilt here (a real pickle round trip)."""
    try:
        raise exc
    except BaseException as raised:
        crossed = CrossedError.of(raised, "child 1")
    return pickle.loads(pickle.dumps(crossed)).rebuild()


def test_an_error_that_pickles_crosses_as_itself() -> None:
    exc = al.ObjectNotFound("no such key: a.jpg", key="a.jpg", status=404)
    exc.add_note("asyncloader: stage=fetch key=a.jpg")
    back = _crossed(exc)
    assert type(back) is al.ObjectNotFound
    assert (str(back), back.key, back.status) == ("no such key: a.jpg", "a.jpg", 404)
    # A mistake of the user's: its notes as it had them, the child's frames kept aside.
    assert back.__notes__ == ["asyncloader: stage=fetch key=a.jpg"]
    assert back.engine_traceback.startswith("in child 1:\nTraceback")  # type: ignore[attr-defined]


def test_the_child_s_traceback_is_shown_for_faults_and_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fault = _crossed(KeyError("a bug"))
    assert fault.__notes__[-1].startswith("in child 1:\nTraceback")
    monkeypatch.setenv("ASYNCLOADER_DEBUG", "1")
    asked = _crossed(al.ObjectNotFound("no such key: a.jpg", key="a.jpg"))
    assert asked.__notes__[-1].startswith("in child 1:\nTraceback")


@pytest.mark.parametrize("kind", ["unpicklable", "ununpicklable", "ununpicklable-decode"])
def test_an_error_that_cannot_cross_comes_as_its_text_and_traceback(kind: str) -> None:
    back = _crossed(hostile(kind, "here"))
    name = type(hostile(kind, "here")).__name__
    assert f"{name}: hostile {kind} error from here" in str(back)
    assert "raised in child 1" in str(back)
    trace = getattr(back, "engine_traceback", None) or back.__notes__[-1]
    assert "in child 1:\nTraceback" in trace
    assert "test_crossing.py" in trace  # where it was raised
    # The nearest class this side knows: ours for a decode error, else Python's.
    assert type(back) is (al.DecodeError if kind == "ununpicklable-decode" else Exception)


def test_a_context_suppressed_by_raise_from_none_does_not_cross() -> None:
    """``raise ... from None`` hides the error it replaced (one whose text held a proxy's
    URL, credentials and all, say): Python shows no context, and neither does the error
    rebuilt across the boundary."""

    top = al.AccessDenied("the proxy refused it (407)", key="k")
    top.__context__ = Unpicklable("http://user:s3cr3t@proxy:3128 said 407")
    top.__suppress_context__ = True  # what raise ... from None leaves
    back = _crossed(top)
    assert type(back) is al.AccessDenied
    assert back.__cause__ is None and back.__context__ is None
    assert "s3cr3t" not in "".join(traceback.format_exception(back))


def test_the_chain_crosses_and_a_cycle_ends() -> None:
    def fail() -> None:
        try:
            raise Unpicklable("the root")
        except Unpicklable as root:
            raise al.DecodeError("bad image", key="k") from root

    try:
        fail()
    except al.DecodeError as exc:
        top = exc
    back = _crossed(top)
    assert type(back) is al.DecodeError and back.key == "k"  # type: ignore[attr-defined]
    assert back.__cause__ is not None and "Unpicklable: the root" in str(back.__cause__)
    a, b = ValueError("a"), KeyError("b")
    a.__context__, b.__context__ = b, a
    back = _crossed(a)
    assert type(back) is ValueError and type(back.__context__) is KeyError
    assert back.__context__.__context__ is None


def test_a_message_that_cannot_be_pickled_is_sent_as_a_failure() -> None:
    from asyncloader._loader._wire import ChildFailed, Stop, send

    class Conn:
        def __init__(self) -> None:
            self.sent: list[object] = []

        def send(self, obj: object) -> None:
            self.sent.append(pickle.loads(pickle.dumps(obj)))

    from dataclasses import dataclass

    from asyncloader._loader._wire import Message

    @dataclass(frozen=True)
    class Holds(Message):
        thing: object

    conn = Conn()
    send(conn, Stop(), "child 2")
    send(conn, Holds(Unpicklable("x")), "child 2")
    assert isinstance(conn.sent[0], Stop)
    failed = conn.sent[1]
    assert isinstance(failed, ChildFailed)
    error = failed.error.rebuild()
    assert isinstance(error, al.PipelineDeadError)
    assert "Holds could not be sent" in str(error)


# --- through real child processes ------------------------------------------------------


@pytest.fixture(scope="module")
def server(jpeg_folder: Path) -> Iterator[S3TestServer]:
    with S3TestServer(load=jpeg_folder, bucket="b", prefix="train/") as s:
        yield s


def _loader(server: S3TestServer, **kw: object) -> al.ImageLoader:
    kw.setdefault("batch_size", 8)
    kw.setdefault("decode", al.DecodeConfig(workers=2))
    kw.setdefault("transform", al.RandomResizedCrop(24))
    return al.ImageLoader(
        "s3://b/train/",
        timeout=None,
        **kw,
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),  # type: ignore[arg-type]
    )


def _raised(make: Callable[[], object]) -> BaseException:
    """What ``make()`` raised, soon; without its frames (they hold the last batch, and with
    it the ring's segment, until a garbage collection frees the cycle they make with it)."""
    t0 = time.monotonic()
    try:
        make()
    except Exception as exc:
        assert time.monotonic() - t0 < SOON
        return without_frames(exc)
    raise AssertionError("nothing was raised")


def _epoch_fails(loader: al.ImageLoader) -> BaseException:
    with loader:
        return _raised(lambda: sum(1 for _ in loader))


def _names(exc: BaseException, kind: str) -> None:
    """The error, or one it was raised from, says what the child raised."""
    seen, e = [], exc
    while e is not None:
        seen.append(f"{e}\n" + "\n".join(getattr(e, "__notes__", [])))
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    assert any(f"hostile {kind} error" in s for s in seen), seen


ENGINE = al.EngineConfig(processes=1)


@pytest.mark.parametrize("kind", ["unpicklable", "ununpicklable"])
def test_an_engine_that_fails_to_start_says_why(server: S3TestServer, kind: str) -> None:
    error = _raised(
        lambda: _loader(server, labels=functools.partial(failing_label, kind), engine=ENGINE)
    )
    _names(error, kind)
    assert "failing_label" in "".join(error.__notes__)  # the engine's traceback


@pytest.mark.parametrize("kind", ["unpicklable", "ununpicklable"])
def test_an_engine_whose_order_fails_to_unpickle_says_why(server: S3TestServer, kind: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(al.PipelineDeadError, match="could not start") as info:
        _loader(server, transform=OnlyHere(kind), engine=ENGINE)
    assert time.monotonic() - t0 < SOON
    _names(info.value, kind)
    assert "__main__" not in str(info.value)  # the script's guard has nothing to do with it


@pytest.mark.parametrize("kind", ["unpicklable", "ununpicklable", "ununpicklable-decode"])
def test_an_engine_that_fails_mid_epoch_says_why(server: S3TestServer, kind: str) -> None:
    loader = _loader(server, transform=FailingCrop(kind, after=20), engine=ENGINE)
    _names(_epoch_fails(loader), kind)


def test_a_decode_error_of_a_hook_of_its_own_is_skipped_under_skip(server: S3TestServer) -> None:
    # An error that cannot cross counts as the sample's failure in the engine, as any
    # decode error: only the counts cross, with the batch's notice.
    crop = FailingCrop("ununpicklable-decode", after=90)
    with _loader(
        server,
        transform=crop,
        engine=ENGINE,
        shuffle=False,
        decode=al.DecodeConfig(workers=1),
        errors=al.ErrorConfig(on_error="skip", max_failures=96),
    ) as loader:
        n = sum(len(labels) for _, labels in loader)
        skipped = loader.stats().skipped
    # Counted by the error's own type, in the engine: only the counts cross.
    assert skipped == {"UnunpicklableDecodeError": 96 - n} and n < 96, (n, skipped)
