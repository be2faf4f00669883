"""Stores for pipeline tests that need no server: objects in memory, and faults on demand.

* :class:`MemoryStore` — an :class:`~asyncloader.ObjectStore` over a :class:`MemoryBucket`
  (a dict of objects shared by every store opened on it).  It passes the conformance suite,
  answers in microseconds, and counts the requests it got.
* :class:`FaultyStore` — wraps any store and injects faults at the protocol level, each
  with a seeded probability per GET and at most ``max_faults_per_key`` times per key (so a
  retrying client always gets through): latency, ``throttle`` (:class:`Throttled`),
  ``error`` (:class:`TransientStoreError`), ``truncate`` (a short body, as from a
  middlebox that rewrote Content-Length: the store did not notice, the fetcher must) and
  ``stall`` (the answer is held back ``stall_seconds``).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from .._base._errors import (
    ClosedError,
    IntegrityError,
    ObjectNotFound,
    Throttled,
    TransientStoreError,
)
from .._base._types import Blob, ObjectInfo, ObjectStore

__all__ = ["MEMORY_FAULTS", "FaultyStore", "MemoryBucket", "MemoryStore"]

MEMORY_FAULTS = ("throttle", "error", "truncate", "stall")


class MemoryBucket:
    """Objects in memory (key → bytes, ETag the MD5 as S3 gives it); thread-safe enough for
    tests that write from one thread while a loader reads (a dict assignment is atomic)."""

    def __init__(self, objects: Mapping[str, bytes] | None = None) -> None:
        self._objects: dict[str, tuple[bytes, str]] = {}
        self.put_many(objects or {})

    def put(self, key: str, data: bytes) -> None:
        self._objects[key] = (bytes(data), hashlib.md5(data, usedforsecurity=False).hexdigest())

    def put_many(self, objects: Mapping[str, bytes]) -> None:
        for key, data in objects.items():
            self.put(key, data)

    def delete(self, key: str) -> None:
        self._objects.pop(key, None)

    def get(self, key: str) -> tuple[bytes, str] | None:
        """``(bytes, etag)``, or None."""
        return self._objects.get(key)

    def sorted_keys(self) -> list[str]:
        return sorted(self._objects)


class MemoryStore:
    """An :class:`~asyncloader.ObjectStore` over a :class:`MemoryBucket` (or a mapping of
    key → bytes, copied into a new one).

    Args:
        bucket: The objects.
        name: Names the store in its URL (``mem://NAME/``), which keys the SSD cache.
    """

    def __init__(
        self, bucket: MemoryBucket | Mapping[str, bytes] | None = None, *, name: str = "memory"
    ) -> None:
        self.bucket = bucket if isinstance(bucket, MemoryBucket) else MemoryBucket(bucket)
        self.name = name
        self.requests: Counter[str] = Counter()  # "list", "stat", "get", "put"
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryStore({self.url!r})"

    @property
    def url(self) -> str:
        return f"mem://{self.name}/"

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")

    def _object(self, key: str) -> tuple[bytes, str]:
        found = self.bucket.get(key)
        if found is None:
            raise ObjectNotFound(f"not found: {self.url}{key}", key=key, status=404)
        return found

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:  # type: ignore[override]
        self._check_open()
        self.requests["list"] += 1
        for key in self.bucket.sorted_keys():
            if key.startswith(prefix):
                found = self.bucket.get(key)
                if found is not None:
                    yield ObjectInfo(key, len(found[0]), found[1])

    async def stat(self, key: str) -> ObjectInfo:
        self._check_open()
        self.requests["stat"] += 1
        data, etag = self._object(key)
        return ObjectInfo(key, len(data), etag)

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        self._check_open()
        self.requests["get"] += 1
        data, current = self._object(key)
        if etag and etag != current:
            raise IntegrityError(
                f"{self.url}{key} changed since it was listed (ETag no longer matches)",
                key=key,
                status=412,
            )
        if start >= len(data) and len(data) > 0:
            raise IntegrityError(
                f"{self.url}{key} is shorter than listed (range not satisfiable)",
                key=key,
                status=416,
            )
        return data[start:end]

    async def put(self, key: str, data: bytes) -> ObjectInfo:
        self._check_open()
        self.requests["put"] += 1
        self.bucket.put(key, data)
        return ObjectInfo(key, len(data), self._object(key)[1])

    async def close(self) -> None:
        self._closed = True


@dataclass
class _Forced:
    count: int
    key_contains: str
    kind: str


@dataclass
class FaultyStore:
    """Wraps ``inner`` and injects faults into its GETs (see the module docstring).

    Attributes:
        inner: The store that answers.
        latency: Added before every request [seconds].
        rates: Probability per GET of each fault kind of :data:`MEMORY_FAULTS`.
        max_faults_per_key: Faults injected per key at most.
        stall_seconds: How long a stalled answer is held back [seconds].
        seed: Seed of the fault draws.
        faults: Faults injected so far, by kind.
    """

    inner: ObjectStore
    latency: float = 0.0
    rates: Mapping[str, float] = field(default_factory=dict)
    max_faults_per_key: int = 3
    stall_seconds: float = 30.0
    seed: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    _rng: random.Random = field(init=False, repr=False)
    _per_key: Counter[str] = field(default_factory=Counter, init=False, repr=False)
    _forced: list[_Forced] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(MEMORY_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {MEMORY_FAULTS}")
        self._rng = random.Random(self.seed)

    @property
    def url(self) -> str:
        return self.inner.url

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r}, rates={dict(self.rates)})"

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)

    async def stat(self, key: str) -> ObjectInfo:
        if self.latency:
            await asyncio.sleep(self.latency)
        return await self.inner.stat(key)

    def fail_next(self, count: int, key_contains: str = "", kind: str = "throttle") -> None:
        """Make the next ``count`` GETs of keys containing ``key_contains`` fail as ``kind``
        (whatever the rates and the per-key limit)."""
        if kind not in MEMORY_FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {MEMORY_FAULTS}")
        self._forced.append(_Forced(count, key_contains, kind))

    def _draw(self, key: str) -> str | None:
        for forced in self._forced:
            if forced.count > 0 and forced.key_contains in key:
                forced.count -= 1
                self.faults[forced.kind] += 1
                return forced.kind
        if self._per_key[key] >= self.max_faults_per_key:
            return None
        for kind in MEMORY_FAULTS:
            rate = self.rates.get(kind, 0.0)
            if rate and self._rng.random() < rate:
                self._per_key[key] += 1
                self.faults[kind] += 1
                return kind
        return None

    async def get(
        self, key: str, *, start: int = 0, end: int | None = None, etag: str = ""
    ) -> Blob:
        if self.latency:
            await asyncio.sleep(self.latency)
        kind = self._draw(key)
        if kind == "throttle":
            raise Throttled(f"throttled on {self.url}{key} (503 SlowDown)", key=key, status=503)
        if kind == "error":
            raise TransientStoreError(f"server error on {self.url}{key} (500)", key=key, status=500)
        if kind == "stall":
            await asyncio.sleep(self.stall_seconds)
        data = await self.inner.get(key, start=start, end=end, etag=etag)
        if kind == "truncate":
            return data[: len(data) // 2]
        return data

    async def close(self) -> None:
        await self.inner.close()
