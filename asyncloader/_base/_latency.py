"""The request latencies of a run, and their quantiles (a leaf): what hedging's deadline,
the fetch budget's Little's law and ``stats()``'s p50/p90/p99 are read from."""

from __future__ import annotations

__all__ = ["LatencyWindow"]


class LatencyWindow:
    """The last ``size`` request latencies, and their quantiles (sorted at most once per
    ``every`` new samples: a quantile costs nothing per request)."""

    __slots__ = ("_every", "_fresh", "_next", "_samples", "_size", "_sorted", "count")

    def __init__(self, size: int = 1024, every: int = 32) -> None:
        self._size = size
        self._every = every
        self._samples: list[float] = []
        self._next = 0
        self._sorted: list[float] = []
        self._fresh = 0  # samples added since the last sort
        self.count = 0  # samples ever added

    def add(self, seconds: float) -> None:
        if len(self._samples) < self._size:
            self._samples.append(seconds)
        else:
            self._samples[self._next] = seconds
            self._next = (self._next + 1) % self._size
        self._fresh += 1
        self.count += 1

    @classmethod
    def pooled(cls, windows: list[LatencyWindow]) -> LatencyWindow:
        """One window holding the samples of ``windows`` (their sizes added)."""
        out = cls(size=max(sum(w._size for w in windows), 1))
        for w in windows:
            out._samples.extend(w._samples)
            out.count += w.count
        out._fresh = len(out._samples)
        return out

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the window (0 when empty) [seconds]."""
        if self._fresh >= self._every or (self._fresh and len(self._sorted) < self._every):
            self._sorted = sorted(self._samples)
            self._fresh = 0
        if not self._sorted:
            return 0.0
        return self._sorted[min(int(q * len(self._sorted)), len(self._sorted) - 1)]
