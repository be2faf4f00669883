"""A batch's extras (``extras=``): metadata columns taken from the dataset, each sample's
seed for the epoch (``"seed"``), sidecar files fetched by the engine beside their images —
through the SSD cache where there is one (one index-thread read for the batch's sidecars,
misses fetched once and written back), their requests in the same fetcher and budget as the
images'.

The values go to the consumer with the batch's notice (one message per batch), in batch
order; a sidecar that cannot be fetched or parsed fails its sample under ``on_error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from .._base._errors import AsyncLoaderError, DecodeError, shown_key
from .._base._stats import Counters
from .._base._types import ObjectInfo
from .._cache import ObjectCache
from .._dataset._metadata import SEED, Extras, parse_sidecar
from .._fetch import Fetcher
from ._batches import Geometry
from ._cache_fill import CacheFill, OnceFetcher, entry_key

__all__ = ["ExtrasReader"]

BatchExtras = dict[str, list[Any]]
"""Each extra's values for a batch's samples, in batch order."""


class ExtrasReader:
    """Reads the extras of a dataset's samples, a batch at a time (on the engine's loop).

    Args:
        extras: The dataset's extras.
        fetcher: Fetches sidecars (the images' fetcher: the same budget and store).
        filling: The SSD cache's way in, or None.
        counters: ``sidecars_cached`` and ``sidecars_fetched`` count sidecars.
        geometry: A bucketed run's (``original_size``, ``crop_top_left``), else None.
    """

    def __init__(
        self,
        extras: Extras,
        fetcher: Fetcher,
        filling: CacheFill | None,
        counters: Counters,
        geometry: Geometry | None = None,
    ) -> None:
        self.extras = extras
        self._geometry = geometry
        self._fetcher = fetcher
        self._filling = filling
        self._counters = counters

    async def batch(
        self,
        indices: Sequence[int],
        seeds: Sequence[int],
        failed: Callable[[AsyncLoaderError, str], BaseException],
    ) -> tuple[BatchExtras, dict[int, BaseException]]:
        """The extras of the samples ``indices`` of a batch (``seeds``: theirs, as their
        decodes draw from them), and the batch positions whose sidecar failed:
        ``failed(error, key)`` decides (it raises under ``"raise"``, else returns what the
        batch counts)."""
        ex = self.extras
        values: BatchExtras = {n: [col[i] for i in indices] for n, col in ex.columns.items()}
        if SEED in ex.names:  # what the decode draws from
            values[SEED] = list(seeds)
        if self._geometry is not None:
            values.update(self._geometry.extras(ex.names, indices, seeds))
        wanted: list[tuple[str, int, ObjectInfo]] = []
        for name, objs in ex.sidecars.items():
            values[name] = [None] * len(indices)
            wanted += [(name, j, o) for j, i in enumerate(indices) if (o := objs[i]) is not None]
        failures: dict[int, BaseException] = {}
        if wanted:
            got = await self._read([o for _, _, o in wanted])
            for (name, j, obj), data in zip(wanted, got, strict=True):
                try:
                    if isinstance(data, BaseException):
                        raise data
                    values[name][j] = _parse(data, ex.suffixes[name], obj.key)
                except AsyncLoaderError as exc:
                    if j not in failures:
                        failures[j] = failed(exc, obj.key)
        return {n: values[n] for n in ex.names}, failures

    async def _read(self, objs: list[ObjectInfo]) -> list[bytes | bytearray | BaseException]:
        """Each object's bytes (or the error fetching it): the cache's, else fetched."""
        fill = self._filling
        c = self._counters
        if fill is None:
            c.sidecars_fetched += len(objs)
            return await asyncio.gather(
                *(self._fetcher.fetch(o) for o in objs), return_exceptions=True
            )
        store = self._fetcher.store
        keys = [entry_key(store, o.key, o.etag) for o in objs]
        in_hand = [await OnceFetcher.shared(fill.once.in_hand(k)) for k in keys]
        cache = fill.cache
        look = [(k, o.size) for k, o, d in zip(keys, objs, in_hand, strict=True) if d is None]
        found = iter(await fill.index.run(_read_cached, cache, look) if look else [])
        out: list[Any] = [d if d is not None else next(found) for d in in_hand]
        misses = [n for n, d in enumerate(out) if d is None]
        c.sidecars_cached += len(objs) - len(misses)
        c.sidecars_fetched += len(misses)
        fetched = await asyncio.gather(
            *(fill.once.fetch(objs[n], keys[n]) for n in misses), return_exceptions=True
        )
        for n, data in zip(misses, fetched, strict=True):
            out[n] = data
        return out


def _read_cached(cache: ObjectCache, entries: list[tuple[str, int]]) -> list[bytes | None]:
    """The cache's bytes of each (key, size), None for a miss (on the index thread)."""
    return [cache.get(key, size) for key, size in entries]


def _parse(data: bytes | bytearray, suffix: str, key: str) -> Any:
    try:
        return parse_sidecar(data, suffix)
    except ValueError as exc:
        raise DecodeError(f"sidecar {shown_key(key)}: {exc}", key=key) from None
