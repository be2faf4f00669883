"""Listing a prefix in parallel across its sub-folders, in sorted key order, as it arrives.

A paginated listing of a million keys is one request after another.  Datasets are almost
always split into folders (classes, shards, dates), so one delimited listing of the top
level finds the sub-folders and those are listed concurrently, each paginated, at most a
window of them ahead of the consumer.  A long flat run of keys is listed by key ranges side
by side (:func:`ranged_pages`, where the store can start a listing after a given key).

The objects come out in sorted key order, a chunk at a time, so a loader that does not
shuffle can start on the first chunk while the rest is still being listed:

* while the top-level listing has met no sub-folder, its pages come out as they arrive
  (a flat folder of a million images streams page by page);
* from the first sub-folder on, the rest of the top level is listed first, then each
  sub-folder's objects come out once that folder (and every one before it) is listed, with
  the top-level objects that sort between them.

Each folder chunk also carries objects listed already that come later in key order
(``ahead``) but decide its ImageFolder labels (see
:class:`asyncloader._dataset._labels.DatasetBuilder`):
the top-level objects after it (images directly under the prefix are class ``""``, the
first), and the objects of folders whose names sort before its own but whose keys sort
after its keys (``b/…`` after ``b./…``, yet class ``b`` before ``b.``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, MutableSequence

from .._base._errors import StoreError
from .._base._types import ObjectInfo

__all__ = [
    "Chunk",
    "FolderListing",
    "Page",
    "PageFetch",
    "PageLister",
    "RangedListing",
    "list_chunks",
    "ranged_pages",
    "split_points",
]

Page = list[ObjectInfo]
PageLister = Callable[[str, MutableSequence[str] | None], AsyncIterator[Page]]
"""``(full_prefix, folders)`` → the pages of one paginated listing, each a list of objects in
the store's (sorted) order; with ``folders`` (a list) the listing is delimited by ``/``, and
the sub-folder prefixes (full, ending in ``/``) of each page are appended to it *before* the
page is yielded."""

Chunk = tuple[list[ObjectInfo], list[ObjectInfo]]
"""``(objects, ahead)``: the next objects in sorted key order, and objects already listed
that come later in that order (top-level ones; only for the label classes)."""


PageFetch = Callable[[str, bool, str, str | None], Awaitable[tuple[Page, list[str], str | None]]]
"""``(full_prefix, delimited, start_after, token)`` → one page: its objects, its sub-folder
prefixes (full), and the continuation token (None on the last page).  ``start_after`` (a
full key, ``""``: from the start) begins a listing after that key (S3 ``start-after``);
``token`` continues one."""


def _by_key(o: ObjectInfo) -> str:
    return o.key


def split_points(
    lo: str, hi: str | None, alphabet: str, *, floor: int, dense: int, depth: int = 4
) -> list[str]:
    """Keys that cut the key space after ``lo`` and before ``hi`` (None: no end) into
    ranges to list side by side: ``lo[:q] + c`` for the ``depth`` positions ``q`` from
    ``dense`` (where a page's keys began to differ) back towards the listing's prefix
    (``floor`` characters, never cut into), and each character ``c`` of ``alphabet`` (the
    characters keys use) above ``lo[q]``.  Sorted, each strictly between ``lo`` and ``hi``.

    Any points list every key exactly once (the ranges ``(lo, p1], (p1, p2], … (pk, hi)``
    are contiguous and cover the rest);
    good ones just make ranges of similar size: keys numbered ``img_0000000`` … whose first
    page ends at ``img_0000999`` get ``img_0001`` … ``img_0009``, ``img_001`` … ``img_1``.
    """
    points: set[str] = set()
    for q in range(min(dense, len(lo) - 1), floor - 1, -1)[:depth]:
        for c in alphabet:
            if c > lo[q]:
                point = lo[:q] + c
                if lo < point and (hi is None or point < hi):
                    points.add(point)
    return sorted(points)


async def ranged_pages(
    fetch: PageFetch,
    full: str,
    *,
    root: str,
    delimited: bool,
    concurrency: int,
) -> AsyncIterator[tuple[Page, list[str]]]:
    """Every page of one listing of ``full`` (keys relative to the store's ``root``, a
    prefix of ``full``) as ``(objects, sub-folder prefixes)``, in key order, listed in
    parallel by key ranges where it is long.

    A paginated listing is one request after another: a million keys at 1000 a page and
    20 ms a request take 20 s.  After the first page, if it found no sub-folders (a flat
    run of keys) and there is more, the rest of the key space is cut at
    :func:`split_points` and the ranges are listed side by side (``start-after`` their
    start, page after page up to their end), ``concurrency`` requests at a time; each
    range's last request may read up to a page past its end (a few dozen pages in all).
    Pages come out in key order.  A sub-folder prefix met again in a later range is not
    repeated.
    """
    sem = asyncio.Semaphore(concurrency)
    Pages = list[tuple[Page, list[str]]]
    tasks: list[asyncio.Task[Pages]] = []
    seen: set[str] = set()
    within = full[len(root) :]  # the listed prefix, as keys are (relative to the root)

    async def page(start_after: str, token: str | None) -> tuple[Page, list[str], str | None]:
        async with sem:
            return await fetch(full, delimited, root + start_after if start_after else "", token)

    async def one_range(lo: str, hi: str) -> Pages:
        """The pages of keys after ``lo`` up to ``hi`` (inclusive: the next range starts
        after it), one after another; the last request may read past ``hi``."""
        out: Pages = []
        last_folder = root + hi
        objects, prefixes, token = await page(lo, None)
        while True:
            # A page is in key order: only one that ends past the range is cut.
            ended = bool(objects) and objects[-1].key > hi
            if ended:
                objects = [o for o in objects if o.key <= hi]
            if any(p > last_folder for p in prefixes):
                ended = True
                prefixes = [p for p in prefixes if p <= last_folder]
            out.append((objects, prefixes))
            if token is None or ended:
                return out
            objects, prefixes, token = await page("", token)

    def fresh(prefixes: list[str]) -> list[str]:
        new = [p for p in prefixes if p not in seen]
        seen.update(new)
        return new

    try:
        objects, prefixes, token = await page("", None)
        yield objects, fresh(prefixes)
        if token is None:
            return
        names = [o.key for o in objects]
        dense = _dense(names) if len(names) > 1 else -1
        # The characters of the positions where the page's keys vary: digits for numbered
        # names, hex digits for hashes (a character no key uses makes an empty range).
        alphabet = "".join(sorted({c for k in names for c in k[dense + 1 : dense + 4]}))
        if prefixes or dense < len(within) or not alphabet:
            while token is not None:  # one page after another
                objects, prefixes, token = await page("", token)
                yield objects, fresh(prefixes)
            return
        last = names[-1]
        points = split_points(last, None, alphabet, floor=len(within), dense=dense)
        for lo, hi in itertools.pairwise([last, *points]):
            tasks.append(asyncio.ensure_future(one_range(lo, hi)))
        for task in list(tasks):
            for objects, prefixes in await task:
                yield objects, fresh(prefixes)
        # The last range has no end: one page after another from the last point.
        if points:
            objects, prefixes, token = await page(points[-1], None)
            yield objects, fresh(prefixes)
        while token is not None:
            objects, prefixes, token = await page("", token)
            yield objects, fresh(prefixes)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


def _shared(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _dense(names: list[str]) -> int:
    """The position where a page's keys begin to differ, less one: the last character
    they share (where the next pages' keys will differ from these)."""
    return _shared(names[0], names[-1]) - 1


async def list_chunks(
    pages: PageLister, full_prefix: str, *, cut: int, concurrency: int
) -> AsyncIterator[Chunk]:
    """Every object under ``full_prefix`` in sorted key order, as :data:`Chunk` s.

    Keys are relative to the store's root, which is ``cut`` characters of ``full_prefix``
    (folders are compared with keys after that cut).  A listing error of any sub-folder is
    raised from the iterator after the other listings are cancelled.
    """
    folders: list[str] = []
    tasks: dict[str, asyncio.Task[list[ObjectInfo]]] = {}
    sem = asyncio.Semaphore(concurrency)

    async def one(folder: str) -> list[ObjectInfo]:
        async with sem:
            objects = [o for page in [p async for p in pages(folder, None)] for o in page]
        objects.sort(key=_by_key)
        return objects

    # The first failing folder listing, so that waiting for an earlier folder does not hide
    # (or outlast) a later one's error.
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_done(task: asyncio.Task[list[ObjectInfo]]) -> None:
        if not task.cancelled() and task.exception() is not None and not failed.done():
            failed.set_exception(task.exception())  # type: ignore[arg-type]

    # Folders are listed at most `window` ahead of the one the consumer is at: as many in
    # parallel as before, but a million keys never wait as objects for an early folder.
    window = 2 * concurrency

    def start(folder: str) -> asyncio.Task[list[ObjectInfo]]:
        task = tasks.get(folder)
        if task is None:
            tasks[folder] = task = asyncio.create_task(one(folder))
            task.add_done_callback(on_done)
        return task

    def start_new(order: list[str], at: int = 0) -> None:
        """Start the listings of ``order[at : at + window]`` (the next ones first)."""
        for folder in order[at : at + window]:
            start(folder)

    async def result(task: asyncio.Task[list[ObjectInfo]]) -> list[ObjectInfo]:
        await asyncio.wait((task, failed), return_when=asyncio.FIRST_COMPLETED)
        if failed.done():
            failed.result()  # raises
        return task.result()

    rest: list[ObjectInfo] = []  # top-level objects after the first sub-folder
    last = ""
    try:
        async for page in pages(full_prefix, folders):
            start_new(folders)
            if rest or not folders:
                now, later = ([], page) if rest else (page, [])
            else:
                first = min(folders)[cut:]
                now = [o for o in page if o.key < first]
                later = [o for o in page if o.key >= first]
            if now:
                if now[0].key <= last or any(a.key >= b.key for a, b in itertools.pairwise(now)):
                    raise StoreError(f"the listing of {full_prefix!r} is not in key order")
                last = now[-1].key
                yield now, []
            rest.extend(later)
        order = sorted(folders)
        rest.sort(key=_by_key)
        names = {folder[cut:-1]: folder for folder in order}  # "cat" → ".../cat/"
        i = 0
        for at, folder in enumerate(order):
            start_new(order, at)
            name = folder[cut:]
            j = i
            while j < len(rest) and rest[j].key < name:
                j += 1
            if j > i:
                yield rest[i:j], []
            i = j
            objects = await result(start(folder))
            ahead = rest[i:]
            # A folder whose name is a prefix of this one, followed by a character that
            # sorts before "/" ("b" for "b."), comes later in key order but is a class
            # before this one: list it first and pass its objects ahead.
            stem = name[:-1]
            for k in range(1, len(stem)):
                if stem[k] < "/" and stem[:k] in names:
                    ahead = ahead + await result(start(names[stem[:k]]))
            # Done with: a folder passed ahead always sorts after the one it is passed
            # with, so no later step asks for this one again; its objects can go.
            del tasks[folder]
            yield objects, ahead
        if i < len(rest):
            yield rest[i:], []
    finally:
        for t in tasks.values():
            t.cancel()
        for t in tasks.values():
            with contextlib.suppress(BaseException):
                await t
        if failed.done():
            failed.exception()  # retrieved: raised above, or moot


class FolderListing:
    """``list`` and ``list_sorted`` for a store with a delimited, paginated listing API:
    the store supplies ``_list_pages`` (a :data:`PageLister`) and ``_ready``."""

    prefix: str
    _list_concurrency: int

    def _list_pages(self, full: str, folders: MutableSequence[str] | None) -> AsyncIterator[Page]:
        raise NotImplementedError

    async def _ready(self) -> None:
        """Called before listing (clients, credentials)."""

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix``, listed in parallel across its sub-folders.

        One delimited listing of the top level finds the sub-folders (class folders, say);
        those are then listed concurrently (``list_concurrency`` at once), each paginated.
        """
        async for objects, _ in self.list_sorted(prefix):
            for info in objects:
                yield info

    async def list_sorted(self, prefix: str = "") -> AsyncIterator[Chunk]:
        """:meth:`list` in sorted key order, as chunks that come out while it runs."""
        await self._ready()
        async for chunk in list_chunks(
            self._list_pages,
            self.prefix + prefix,
            cut=len(self.prefix),
            concurrency=self._list_concurrency,
        ):
            yield chunk


class RangedListing(FolderListing):
    """:class:`FolderListing` for a store whose listing can start after a given key (S3
    ``start-after``, GCS ``startOffset``): the store supplies ``_page`` (a
    :data:`PageFetch`), and a long flat run of keys is listed by key ranges side by side
    (:func:`ranged_pages`)."""

    async def _page(
        self, full: str, delimited: bool, start_after: str, token: str | None
    ) -> tuple[Page, list[str], str | None]:
        raise NotImplementedError

    async def _list_pages(
        self, full: str, folders: MutableSequence[str] | None
    ) -> AsyncIterator[Page]:
        """One listing of ``full``; with ``folders``, delimited (sub-folders collected
        there)."""
        pages = ranged_pages(
            self._page,
            full,
            root=self.prefix,
            delimited=folders is not None,
            concurrency=self._list_concurrency,
        )
        async for page, prefixes in pages:
            if folders is not None:
                folders.extend(prefixes)
            yield page
