"""The cache's CRC-32 extension gives zlib's values, on both of its paths (carry-less
folding where the CPU has it, a byte table otherwise), for every length, alignment and
running value."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

_crc = pytest.importorskip("asyncloader._cache._crc", reason="the _crc extension is not built")


@pytest.fixture(params=[True, False], ids=["folding", "table"])
def path(request: pytest.FixtureRequest) -> Iterator[bool]:
    fast = _crc.set_fast(request.param)
    if request.param and not fast:
        pytest.skip("this CPU has no carry-less multiplication")
    try:
        yield fast
    finally:
        _crc.set_fast(True)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=2000),
    head=st.integers(0, 15),
    value=st.integers(0, 2**32 - 1),
)
def test_equals_zlib(data: bytes, head: int, value: int) -> None:
    view = memoryview(data)[min(head, len(data)) :]  # any alignment
    try:
        for fast in (True, False):
            _crc.set_fast(fast)
            assert _crc.crc32(view) == zlib.crc32(view)
            assert _crc.crc32(view, value) == zlib.crc32(view, value)
    finally:
        _crc.set_fast(True)


@pytest.mark.parametrize("size", [63, 64, 65, 79, 80, 127, 128, 4095, 4096, 110_017, 3_000_001])
def test_large_buffers_and_running_values(path: bool, size: int) -> None:
    data = bytes((i * 131 + (i >> 7)) & 0xFF for i in range(size))
    assert _crc.crc32(data) == zlib.crc32(data)
    half = size // 2  # continued: crc(a + b) from crc(a)
    assert _crc.crc32(data[half:], _crc.crc32(data[:half])) == zlib.crc32(data)
    assert _crc.crc32(bytearray(data)) == zlib.crc32(data)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        _crc.crc32("text")
    with pytest.raises(BufferError):
        _crc.crc32(memoryview(bytes(64))[::2])  # not contiguous
