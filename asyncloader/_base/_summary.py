"""A loader's stats as a few lines of text (:meth:`~._stats.Stats.summary`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import first_keys

if TYPE_CHECKING:
    from ._stats import Stats

__all__ = ["summary"]


def summary(self: Stats) -> str:
    """A few human lines of a loader's stats: throughput, the bounding stage, the cache,
    requests, retries and skips, sidecars, what each source gave."""
    mb = self.bytes_fetched / 1e6
    ahead = self.samples_ahead
    bound = self.bound if self.bound != "unknown" else "too short a run to tell"
    lines = [
        f"{self.samples} samples in {self.batches} batches, {self.wall_seconds:.1f} s "
        f"({self.samples_per_second:.0f} samples/s, {mb / self.wall_seconds:.1f} MB/s "
        "fetched)" + (f"; {ahead} more decoded ahead of the training loop" if ahead else ""),
        f"bound by: {bound}  (decode workers {self.decode_workers}"
        + (f" of {self.cpu_budget}" if self.cpu_budget else "")
        + f", consumer waited {self.consumer_wait_seconds:.1f} s, "
        f"decode busy {self.decode_utilization:.0%}, peak in flight "
        f"{self.inflight_peak}/{self.max_inflight} (limit now {self.inflight_limit}, "
        f"{self.backoffs} back-offs), mean fetch "
        f"{self.mean_fetch_seconds * 1e3:.1f} ms)",
        f"cache: {self.cache_hits} hits ({self.bytes_from_cache / 1e6:.0f} MB from disk"
        + (f"; {self.cache_scaled_hits} from scaled copies" if self.cache_scaled_hits else "")
        + "), "
        f"{self.cache_misses} misses, {self.cache_stored} stored, "
        f"{self.cache_damaged} damaged, {self.cache_store_failed} store failures, "
        f"{self.cache_store_skipped} not stored (disk behind)"
        + (
            f"; the data does not fit: {self.cache_share:.0%} of it is kept"
            if self.cache_share < 1.0
            else ""
        )
        if self.cache_hits or self.cache_misses
        else "cache: off",
        f"requests {self.requests} (p50/p90/p99 {self.request_p50 * 1e3:.0f}/"
        f"{self.request_p90 * 1e3:.0f}/{self.request_p99 * 1e3:.0f} ms; hedges "
        f"{self.hedges_sent} sent, {self.hedges_won} won), "
        f"retries {_counted(self.retries)}, skipped {_counted(self.skipped)}"
        + (f" [{first_keys(self.skipped_keys, 3)}]" if self.skipped_keys else "")
        + f", worker restarts {self.worker_restarts}"
        + (f", engine restarts {self.engine_restarts}" if self.engine_restarts else ""),
    ]
    if len(self.samples_by_source) > 1:
        lines.append(
            "sources: "
            + ", ".join(f"{url} {n}" for url, n in sorted(self.samples_by_source.items()))
        )
    if self.unnamed_images:
        lines.append(f"images left out, not named by the metadata file: {self.unnamed_images}")
    if self.sidecars_fetched or self.sidecars_cached:
        lines.append(
            f"sidecar files: {self.sidecars_fetched} fetched, {self.sidecars_cached} from the cache"
        )
    return "\n".join(line.rstrip() for line in lines)


def _counted(by_reason: dict[str, int]) -> str:
    """``3 (throttled 2, transient 1)``, or ``0``."""
    total = sum(by_reason.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {n}" for k, n in by_reason.items() if n) + ")"
