"""What ``bench`` measured and recommends: :class:`BenchReport` (its text summary, its JSON
form and its plot) and :class:`FetchLevel`.  A leaf module: values and their presentation."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from .._base._errors import first_keys

__all__ = ["BenchReport", "FetchLevel"]


@dataclass(slots=True)
class FetchLevel:
    """Whole-object GETs at one number of requests in flight."""

    inflight: int
    gets_per_second: float
    mb_per_second: float
    client_cpu_ms_per_get: float
    other_cpu_ms_per_get: float  # the answering processes on this machine (an emulator, a proxy)
    p50_ms: float
    p99_ms: float
    throttled: int = 0


@dataclass(slots=True)
class BenchReport:
    """What :func:`bench` measured, and what it recommends.

    ``predicted_images_per_second`` and ``bound`` ("fetch" or "decode") are for an epoch
    streamed from the store with ``settings``; ``cached_images_per_second`` and
    ``cached_bound`` ("decode" or "disk") for epochs read from the cache.
    ``undecodable``: the sampled objects that do not decode (shown as in messages), left out
    of the decode measurement.
    """

    url: str
    cpus: int
    cpu_budget: str
    objects_listed: int
    listing_complete: bool
    listed_bytes: int
    sample_objects: int
    mean_object_bytes: float
    latency_ms: dict[str, float]
    fetch: list[FetchLevel]
    decode_cpu_ms_per_image: float
    decode_images_per_second_per_core: float
    decode_images_per_second: float
    disk: dict[str, float | str] | None
    predicted_images_per_second: float
    bound: str
    cached_images_per_second: float | None
    cached_bound: str | None
    settings: dict[str, Any]
    reasons: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Everything but the raw latency samples, as JSON-ready values."""
        out = asdict(self)
        out.pop("latencies_ms")
        return out

    def summary(self) -> str:
        lat = self.latency_ms
        lines = [
            f"{self.url}: {self.objects_listed}{'' if self.listing_complete else '+'} objects "
            f"listed ({self.listed_bytes / 1e9:.2f} GB), {self.sample_objects} sampled "
            f"(mean {self.mean_object_bytes / 1e3:.0f} KB); {self.cpu_budget} here",
            f"first-byte latency: p50 {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, "
            f"p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms",
            "",
            f"{'in flight':>9} {'GETs/s':>9} {'MB/s':>8} {'CPU ms/GET':>11} {'others':>7} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'throttled':>9}",
        ]
        for lv in self.fetch:
            lines.append(
                f"{lv.inflight:9d} {lv.gets_per_second:9.0f} {lv.mb_per_second:8.1f} "
                f"{lv.client_cpu_ms_per_get:11.3f} {lv.other_cpu_ms_per_get:7.3f} "
                f"{lv.p50_ms:8.1f} {lv.p99_ms:8.1f} "
                f"{lv.throttled:9d}"
            )
        lines += [
            "",
            f"decode + transform: {self.decode_cpu_ms_per_image:.2f} ms of CPU per image, "
            f"{self.decode_images_per_second_per_core:.0f} images/s per core, "
            f"{self.decode_images_per_second:.0f} images/s with "
            f"{self.settings['decode_workers']} workers",
        ]
        if self.undecodable:
            bad = self.undecodable
            lines.append(
                f"  {len(bad)} of the {self.sample_objects} sampled objects do not decode and "
                f"are left out of it (a loader skips or fails on them): {first_keys(bad, 3)}"
            )
        if self.disk is not None:
            d = self.disk
            lines.append(
                f"cache disk ({d['directory']}): write {d['write_mb_per_second']:.0f} MB/s, "
                f"read {d['read_mb_per_second']:.0f} MB/s ({d['read_objects_per_second']:.0f} "
                "objects/s)"
            )
        lines += ["", f"bound: {self.bound} — {self.reasons[0]}"]
        lines.append(f"predicted: {self.predicted_images_per_second:.0f} images/s from the store")
        if self.cached_images_per_second is not None:
            lines.append(
                f"           {self.cached_images_per_second:.0f} images/s from the cache "
                f"(bound: {self.cached_bound})"
            )
        lines += [f"  {r}" for r in self.reasons[1:]]
        s = self.settings
        cache = f", cache_dir={s['cache_dir']!r}" if s["cache"] else ""
        lines += [
            "",
            "settings:",
            f"  ImageLoader({self.url!r}{cache},",
            f"              fetch=FetchConfig(max_inflight={s['max_inflight']}),",
            f"              decode=DecodeConfig(workers={s['decode_workers']}))"
            f"  # {s['engine_processes']} engine process(es)",
            f"({self.seconds:.0f} s)",
        ]
        return "\n".join(lines)

    @staticmethod
    def check_plot() -> None:
        """Raise :class:`ImportError` (one line: how to install matplotlib) unless
        :meth:`plot` can draw: checked before a measurement starts, not after it."""
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ImportError("--plot needs matplotlib: pip install 'asyncloader[plot]'")

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw GETs/s and MB/s against requests in flight, and the first-byte latency
        distribution, to a PNG (needs matplotlib: ``pip install 'asyncloader[plot]'``)."""
        self.check_plot()
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        xs = [lv.inflight for lv in self.fetch]
        left.plot(xs, [lv.gets_per_second for lv in self.fetch], "o-", label="GETs/s")
        left.axhline(
            self.decode_images_per_second, color="tab:red", ls="--", label="decode images/s"
        )
        left.axhline(
            self.predicted_images_per_second,
            color="tab:purple",
            ls="-.",
            label="predicted loader images/s",
        )
        left.axvline(self.settings["max_inflight"], color="gray", ls=":", label="recommended")
        left.set_xscale("log", base=2)
        left.set_xlabel("requests in flight")
        left.set_ylabel("GETs/s")
        left.set_title("throughput against requests in flight")
        # MB/s is GETs/s times the bytes a GET brings: a second scale on the same line (a
        # second line would lie on top of the first and hide it).
        gets = sum(lv.gets_per_second for lv in self.fetch)
        mb_per_get = sum(lv.mb_per_second for lv in self.fetch) / gets if gets else 0.0
        if mb_per_get > 0:
            mb = left.secondary_yaxis(
                "right", functions=(lambda g: g * mb_per_get, lambda m: m / mb_per_get)
            )
            mb.set_ylabel(f"MB/s ({mb_per_get * 1e3:.0f} KB per GET)")
        left.legend(loc="upper left")
        lat = sorted(self.latencies_ms)
        if lat:
            right.hist(lat, bins=min(60, max(10, len(lat) // 5)), color="tab:blue")
            for name in ("p50", "p90", "p99"):
                right.axvline(self.latency_ms[name], ls="--", color="k", lw=0.8)
                right.text(
                    self.latency_ms[name],
                    0.98,
                    f" {name}",
                    rotation=90,
                    va="top",
                    transform=right.get_xaxis_transform(),
                )
            right.set_yscale("log")
        right.set_xlabel("first-byte latency [ms]")
        right.set_ylabel("requests")
        right.set_title(f"latency distribution ({len(lat)} requests)")
        fig.suptitle(
            f"{self.url}: {self.predicted_images_per_second:.0f} images/s predicted, "
            f"bound: {self.bound}"
        )
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
