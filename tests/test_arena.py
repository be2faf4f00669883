"""Fetched bytes reach decode processes through a shared-memory arena: the allocator never
hands out overlapping extents and merges what comes back; the pool decodes the same pixels
through the arena as through the socket, and falls back to the socket when it is full."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncloader as al
from asyncloader._base._types import DecodeJob
from asyncloader._decode import DecodeSpec, ProcessDecodePool, decode_into
from asyncloader._decode._arena import ALIGN, Extents
from asyncloader._device._ring import BatchRing


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(ALIGN, 1 << 16),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 9000)), max_size=120),
)
def test_extents_never_overlap_and_merge_back(capacity: int, ops: list[tuple[bool, int]]) -> None:
    ext = Extents(capacity)
    held: list[tuple[int, int]] = []
    for take, size in ops:
        if take or not held:
            at = ext.alloc(size)
            if at is not None:
                assert at % ALIGN == 0 and at + size <= ext.capacity
                held.append((at, size))
        else:
            at, n = held.pop(size % len(held))
            ext.free(at, n)
        spans = sorted((a, a + -(-max(n, 1) // ALIGN) * ALIGN) for a, n in held)
        assert all(x[1] <= y[0] for x, y in itertools.pairwise(spans))
        free = ext.free_extents
        assert all(a + n < b for (a, n), (b, _) in itertools.pairwise(free))  # merged
        assert ext.used + sum(n for _, n in free) == ext.capacity
    for at, n in held:
        ext.free(at, n)
    assert ext.free_extents == [(0, ext.capacity)] and ext.used == 0


def test_a_double_free_is_refused() -> None:
    ext = Extents(4096)
    at = ext.alloc(100)
    assert at is not None
    ext.free(at, 100)
    with pytest.raises(ValueError, match="free already"):
        ext.free(at, 100)


@pytest.mark.parametrize("arena_bytes", [8 << 20, ALIGN])  # room; no room: the socket
def test_processes_decode_the_same_pixels_through_the_arena(
    jpeg_folder: Path, arena_bytes: int
) -> None:
    datas = [p.read_bytes() for p in sorted(jpeg_folder.rglob("*.jpg"))[:24]]
    spec = DecodeSpec((3, 32, 32), al.RandomResizedCrop(32))
    expected = np.empty((len(datas), 3, 32, 32), np.uint8)
    for i, data in enumerate(datas):
        decode_into(data, expected[i], spec, i, f"k{i}")
    ring = BatchRing(2, len(datas), (3, 32, 32), shared=True)
    assert ring.ref is not None

    async def run() -> int:
        pool = ProcessDecodePool(2, spec, ring.ref, ring.images.shape, arena_bytes=arena_bytes)
        await pool.start()
        try:
            jobs = [DecodeJob(bytearray(d), 1, i, i, f"k{i}") for i, d in enumerate(datas)]
            outcomes = await pool.decode_many(jobs)
            assert all(not isinstance(o, BaseException) for o in outcomes)
            assert pool._arena is None or pool._arena.used == 0  # all given back
            return pool.arena_jobs
        finally:
            await pool.aclose()

    through_arena = asyncio.run(run())
    assert np.array_equal(ring.images[1], expected)
    assert through_arena == (len(datas) if arena_bytes > ALIGN else 0)
    ring.close()
