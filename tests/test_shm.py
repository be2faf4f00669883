"""Segments of shared memory (``_base/_shm.py``): a memfd on Linux, a named POSIX segment
elsewhere; the same bytes through every mapping, nothing left once closed, and a segment
still viewed stays mapped instead of crashing its reader."""

from __future__ import annotations

import os

import numpy as np
import pytest

import asyncloader._base._shm as shm
from asyncloader._base._shm import Segment

from ._shm import memfds, segments


@pytest.fixture(params=["memfd", "posix"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "memfd" and not hasattr(os, "memfd_create"):
        pytest.skip("no memfd here")
    monkeypatch.setattr(shm, "USE_MEMFD", request.param == "memfd")
    return str(request.param)


def test_a_segment_is_the_same_bytes_through_every_mapping(kind: str) -> None:
    before = memfds(os.getpid()), segments([os.getpid()])
    made = Segment.new(1 << 20, "a test segment")
    assert (made.ref.fd is not None) == (kind == "memfd")
    assert (made.ref.name is not None) == (kind == "posix")
    other = Segment.attach(made.ref) if kind == "posix" else _attach_a_copy(made)
    np.frombuffer(made.buf, np.uint8)[:5] = [1, 2, 3, 4, 5]
    assert bytes(other.buf[:5]) == bytes([1, 2, 3, 4, 5])
    other.close()
    made.close()
    assert (memfds(os.getpid()), segments([os.getpid()])) == before


def _attach_a_copy(made: Segment) -> Segment:
    """The segment mapped as a child maps it: through a descriptor of its own."""
    assert made.ref.fd is not None
    return Segment.attach(shm.SegmentRef(made.ref.size, fd=os.dup(made.ref.fd)))


def test_a_segment_still_viewed_stays_mapped(kind: str) -> None:
    made = Segment.new(4096, "a test segment")
    view = np.frombuffer(made.buf, np.uint8)
    view[0] = 7
    with pytest.raises(BufferError):
        made.close()
    assert view[0] == 7  # still readable
    assert segments([os.getpid()]) == set()  # a name is gone at once all the same
    del view
    made.close()
