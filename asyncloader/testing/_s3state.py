"""What the light S3 server (``_s3server``) serves: buckets of objects (loaded from a folder,
or synthetic: N keys over one body), bucket regions and requester-pays, the fault rates and
their seeded draws (each key failing at most ``max_faults_per_key`` times), and the request
counters."""

from __future__ import annotations

import argparse
import bisect
import hashlib
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FAULT_KINDS", "ServerState", "Stored", "Synthetic", "load_folder", "synthetic_bucket"]

FAULT_KINDS = (
    "slowdown",
    "throttle",
    "error",
    "reset",
    "truncate",
    "stall",
    "short",
    "stall_body",
)


@dataclass
class Stored:
    data: bytes
    etag: str


class Synthetic(Mapping[str, Stored]):
    """A read-only bucket of ``count`` keys that all hold one body: sizes and ETags only,
    the bytes made on demand, so that a million keys cost their names and no bodies.

    Keys are ``prefix + "class_FFFF/img_NNNNNNN.jpg"`` over ``folders`` class folders
    (sample ``i`` in folder ``i % folders``), or ``prefix + "img_NNNNNNN.jpg"`` (flat).
    """

    def __init__(self, count: int, folders: int, prefix: str, body: bytes) -> None:
        self.object = Stored(body, hashlib.md5(body, usedforsecurity=False).hexdigest())
        if folders:
            names = (f"{prefix}class_{i % folders:04d}/img_{i:07d}.jpg" for i in range(count))
        else:
            names = (f"{prefix}img_{i:07d}.jpg" for i in range(count))
        self.sorted = sorted(names)

    def __getitem__(self, key: str) -> Stored:
        i = bisect.bisect_left(self.sorted, key)
        if i == len(self.sorted) or self.sorted[i] != key:
            raise KeyError(key)
        return self.object

    def __iter__(self) -> Iterator[str]:
        return iter(self.sorted)

    def __len__(self) -> int:
        return len(self.sorted)


@dataclass
class ServerState:
    buckets: dict[str, dict[str, Stored] | Synthetic] = field(default_factory=dict)
    latency: float = 0.0
    fault_rates: dict[str, float] = field(default_factory=dict)
    max_faults_per_key: int = 3
    stall_seconds: float = 30.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    faults_by_key: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    gets_by_key: Counter[str] = field(default_factory=Counter)
    ranges_by_key: Counter[str] = field(default_factory=Counter)  # GETs with a Range header
    sorted_keys: dict[str, list[str]] = field(default_factory=dict)  # bucket → keys, in order
    regions: dict[str, str] = field(default_factory=dict)  # bucket → region (else any)
    region_answer: str = "redirect"  # or "malformed": how a wrong region is answered
    requester_pays: set[str] = field(default_factory=set)  # buckets that bill the requester
    rate_limit: float = 0.0  # object requests per second before 503 SlowDown (0: none)
    burst: float = 0.0  # the token bucket's size
    _tokens: float = 0.0
    _refilled: float = 0.0

    def admit(self, now: float) -> bool:
        """A token-bucket rate limit on object requests, as a store throttles a prefix."""
        if self.rate_limit <= 0:
            return True
        self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.rate_limit)
        self._refilled = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def _writable(self, bucket: str) -> dict[str, Stored]:
        objects = self.buckets.setdefault(bucket, {})
        if isinstance(objects, Synthetic):  # a million names over one body: read-only
            objects = self.buckets[bucket] = dict(objects)
        return objects

    def put(self, bucket: str, key: str, data: bytes) -> str:
        etag = hashlib.md5(data, usedforsecurity=False).hexdigest()
        self._writable(bucket)[key] = Stored(data, etag)
        self.sorted_keys.pop(bucket, None)
        return etag

    def delete(self, bucket: str, key: str) -> None:
        if bucket in self.buckets:
            self._writable(bucket).pop(key, None)
        self.sorted_keys.pop(bucket, None)

    def keys(self, bucket: str) -> list[str]:
        """The bucket's keys in order, kept between requests (a page costs its own size,
        not the bucket's)."""
        keys = self.sorted_keys.get(bucket)
        if keys is None:
            objects = self.buckets.get(bucket, {})
            keys = objects.sorted if isinstance(objects, Synthetic) else sorted(objects)
            self.sorted_keys[bucket] = keys
        return keys

    def pick_fault(self, key: str, kinds: tuple[str, ...] = FAULT_KINDS) -> str | None:
        if not self.fault_rates or self.faults_by_key[key] >= self.max_faults_per_key:
            return None
        roll = self.rng.random()
        for kind, rate in self.fault_rates.items():
            if kind not in kinds:
                continue
            if roll < rate:
                self.faults_by_key[key] += 1
                self.counters[f"fault_{kind}"] += 1
                return kind
            roll -= rate
        return None


def load_folder(state: ServerState, bucket: str, folder: Path, prefix: str = "") -> int:
    """Load every file under ``folder`` (but dotfiles) into ``bucket`` as prefix + path."""
    n = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            key = prefix + path.relative_to(folder).as_posix()
            state.put(bucket, key, path.read_bytes())
            n += 1
    return n


def synthetic_bucket(args: argparse.Namespace) -> Synthetic:
    body = Path(args.synthetic_body).read_bytes() if args.synthetic_body else _tiny_jpeg()
    return Synthetic(args.synthetic, args.synthetic_folders, args.prefix, body)


def _tiny_jpeg() -> bytes:
    """A small, valid JPEG (64×48) for synthetic keys."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (120, 60, 30)).save(buf, "JPEG")
    return buf.getvalue()
