"""Listing a prefix in parallel across its sub-folders, for every store with a delimiter.

A flat paginated listing of a million keys is one request after another.  Datasets are
almost always split into folders (classes, shards, dates), so one delimited listing of the
top level finds the sub-folders and those are listed concurrently, each paginated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, MutableSequence

from .._types import ObjectInfo

__all__ = ["PageLister", "list_tree"]

PageLister = Callable[[str, MutableSequence[str] | None], AsyncIterator[ObjectInfo]]
"""``(full_prefix, folders)`` → objects of one paginated listing; with ``folders`` (a list)
the listing is delimited by ``/`` and the sub-folder prefixes found are appended to it."""


async def list_tree(
    pages: PageLister, full_prefix: str, *, concurrency: int
) -> AsyncIterator[ObjectInfo]:
    """Every object under ``full_prefix``: the top level first, then its sub-folders at once.

    Order is not defined (the loader sorts).  A listing error of any sub-folder is raised
    from the iterator after the sibling listings are cancelled.
    """
    folders: list[str] = []
    async for info in pages(full_prefix, folders):
        yield info
    if not folders:
        return
    out: asyncio.Queue[ObjectInfo | None] = asyncio.Queue(maxsize=10_000)
    sem = asyncio.Semaphore(concurrency)

    async def one(folder: str) -> None:
        async with sem:
            async for info in pages(folder, None):
                await out.put(info)

    async def run_all() -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                for folder in folders:
                    tg.create_task(one(folder))
        finally:
            await out.put(None)

    runner = asyncio.create_task(run_all())
    try:
        while (item := await out.get()) is not None:
            yield item
        await runner  # re-raises a listing error
    finally:
        runner.cancel()
        with contextlib.suppress(BaseException):
            await runner
