"""A source of a loader that reads several (``asyncloader.Source``): a leaf module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Source", "as_sources"]


@dataclass(frozen=True, slots=True)
class Source:
    """One folder of a loader that mixes several (``ImageLoader([Source(...), ...])``).

    Attributes:
        url: The folder: ``s3://``, ``gs://``, ``az://``, ``https://`` with a manifest, or
            a local path; sources may live in different stores and clouds.
        weight: Its share of each epoch, relative to the other sources' weights; None (all
            sources): each gives its size, every sample once an epoch.  Give every source
            a weight or none.
        labels: How its samples are labelled (as the loader's ``labels=``); None: the
            loader's.
        store_options: How to reach its store (as the loader's ``store_options=``); None:
            the loader's.
    """

    url: str
    weight: float | None = None
    labels: str | Callable[[str], int] | None = None
    store_options: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ValueError(f"a Source needs a URL, not {self.url!r}")
        if self.weight is not None and not self.weight >= 0:
            raise ValueError(f"a source's weight must be >= 0, not {self.weight!r}")


def as_sources(
    url: str | Source | Sequence[str | Source],
    labels: str | Callable[[str], int] | None = None,
    store_options: dict[str, Any] | None = None,
) -> tuple[Source, ...] | None:
    """``url`` as sources when it names several (a list, or a :class:`Source`); None for
    one URL given as a string.  Each source is resolved here, once: one without labels or
    store options of its own gets the loader's ``labels`` and ``store_options``.

    Raises:
        ValueError: an empty list; weights given to some sources and not others.
    """
    if isinstance(url, str):
        return None
    given = [url] if isinstance(url, Source) else list(url)
    if not given:
        raise ValueError("no sources: give a URL, a Source or a list of them")
    sources = tuple(
        replace(
            s,
            labels=s.labels if s.labels is not None else labels,
            store_options=s.store_options if s.store_options is not None else store_options,
        )
        for s in (s if isinstance(s, Source) else Source(s) for s in given)
    )
    weighted = [s.weight is not None for s in sources]
    if any(weighted) and not all(weighted):
        raise ValueError(
            "give every source a weight, or none (each then gives its size): "
            + ", ".join(f"{s.url} weight={s.weight}" for s in sources)
        )
    return sources
