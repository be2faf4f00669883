"""``check_object_store``: the behaviour every :class:`~asyncloader.ObjectStore` must have.

One suite, run by our tests against every backend on a real server (S3 on moto_server, Azure
on Azurite, local folders, HTTP on a local server), and usable by anyone writing a store of
their own.  A :class:`StoreFixture` says how to write objects below the store's root and how
to open stores on it; optional parts (a fault proxy for throttling, wrong credentials) are
checked when given.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from .._base._config import FetchConfig
from .._base._errors import AccessDenied, IntegrityError, ObjectNotFound, StoreError, Throttled
from .._base._stats import Counters
from .._base._types import ObjectInfo, ObjectStore, WritableStore
from .._fetch import Fetcher

__all__ = ["StoreFixture", "check_object_store"]

PAGED = 1005  # objects in one folder: more than a 1000-key listing page


@dataclass
class StoreFixture:
    """How the suite reaches one backend.

    Attributes:
        name: For messages ("s3", "azure", ...).
        put_many: Write (or replace) objects below the store's root: key → bytes.
        open: A new store on the root.
        open_throttled: A new store on the root through a fault proxy, and a function
            ``fail(count, key)`` making the next ``count`` requests for ``key`` answer as
            throttled.  None: the backend cannot be throttled (a local folder).
        open_wrong_credentials: A store on the same root with credentials that are wrong,
            and the secret that must not leak into errors.  None: no credentials to get
            wrong.
        account: The bucket/container/account name an access error must mention.
    """

    name: str
    put_many: Callable[[Mapping[str, bytes]], None]
    open: Callable[[], ObjectStore]
    open_throttled: Callable[[], tuple[ObjectStore, Callable[[int, str], None]]] | None = None
    open_wrong_credentials: Callable[[], tuple[ObjectStore, str]] | None = None
    account: str = ""


def _blob(n: int, seed: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


def check_object_store(fixture: StoreFixture) -> None:
    """Run every check against ``fixture``; raise AssertionError naming the first failure.

    Writes about 1030 small objects below the root (``paged/``, ``tree/``, ``blobs/``,
    ``mutable.bin``); a store that writes (:class:`~asyncloader.WritableStore`) also
    writes ``written/``.  Each check opens and closes its own store.
    """
    data = {f"paged/obj{i:05d}.bin": str(i).encode() for i in range(PAGED)}
    tree = {
        "tree/a/1.bin": b"a1",
        "tree/a/2.bin": b"a22",
        "tree/b/c/3.bin": b"bc333",
        "tree/b/4.bin": b"b4444",
        "tree/top.bin": b"top",
        "tree/name with spaces+plus.bin": b"odd",
    }
    blobs = {"blobs/small.bin": _blob(1000, 1), "blobs/large.bin": _blob(300_001, 2)}
    fixture.put_many({**data, **tree, **blobs, "mutable.bin": _blob(64, 3)})

    def run(check: Callable[[ObjectStore], Coroutine[Any, Any, None]]) -> None:
        async def main() -> None:
            store = fixture.open()
            try:
                await check(store)
            finally:
                await store.close()

        try:
            asyncio.run(main())
        except AssertionError as exc:
            exc.add_note(f"store {fixture.name}: {check.__name__}")
            raise

    async def listing_paginates(store: ObjectStore) -> None:
        objs = [o async for o in store.list("paged/")]
        keys = [o.key for o in objs]
        assert len(keys) == len(set(keys)), "a listing returned a key twice"
        assert sorted(keys) == sorted(data), (
            f"listing paged/ gave {len(keys)} keys, expected {len(data)}"
        )
        one = next(o for o in objs if o.key == "paged/obj00012.bin")
        assert one.size == 2, one

    async def listing_prefixes(store: ObjectStore) -> None:
        got = {o.key: o for o in [o async for o in store.list("tree/")]}
        assert sorted(got) == sorted(tree), sorted(got)
        for key, value in tree.items():
            assert got[key].size == len(value), got[key]
        sub = sorted([o.key async for o in store.list("tree/b/")])
        assert sub == ["tree/b/4.bin", "tree/b/c/3.bin"], sub
        partial = sorted([o.key async for o in store.list("tree/a/1")])
        assert partial == ["tree/a/1.bin"], partial
        assert [o async for o in store.list("no-such-prefix/")] == []
        everything = {o.key async for o in store.list()}
        assert set(data) | set(tree) | set(blobs) <= everything

    async def ranges_are_exact(store: ObjectStore) -> None:
        for key, value in blobs.items():
            info = await store.stat(key)
            assert info.size == len(value), info
            n = len(value)
            assert bytes(await store.get(key)) == value
            assert bytes(await store.get(key, etag=info.etag)) == value
            cases = [(0, 1), (n - 1, n), (0, n), (17, n // 2), (n // 2, n)]
            for start, end in cases:
                got = bytes(await store.get(key, start=start, end=end, etag=info.etag))
                assert got == value[start:end], f"{key}[{start}:{end}] differs"
            assert bytes(await store.get(key, start=n - 5)) == value[n - 5 :]
        listed = {o.key: o async for o in store.list("blobs/")}
        for key in blobs:
            # A listing without ETags (a manifest may lack them) reports "": no check.
            if listed[key].etag:
                assert listed[key].etag == (await store.stat(key)).etag, "listing and stat ETags"
        odd = "tree/name with spaces+plus.bin"
        assert bytes(await store.get(odd)) == b"odd"

    async def missing_object(store: ObjectStore) -> None:
        for call in (store.get("blobs/missing.bin"), store.stat("blobs/missing.bin")):
            try:
                await call
            except ObjectNotFound as exc:
                assert "missing.bin" in str(exc), str(exc)
            else:
                raise AssertionError("a missing object did not raise ObjectNotFound")

    async def replaced_mid_read(store: ObjectStore) -> None:
        old = await store.stat("mutable.bin")
        first = bytes(await store.get("mutable.bin", start=0, end=32, etag=old.etag))
        new_value = _blob(64, 4)
        await asyncio.to_thread(fixture.put_many, {"mutable.bin": new_value})
        try:
            await store.get("mutable.bin", start=32, end=64, etag=old.etag)
        except IntegrityError as exc:
            assert "mutable.bin" in str(exc), str(exc)
        else:
            raise AssertionError("the second half of a replaced object was served")
        assert first == _blob(64, 3)[:32]
        new = await store.stat("mutable.bin")
        assert new.etag != old.etag, "replacing an object did not change its ETag"
        assert bytes(await store.get("mutable.bin", etag=new.etag)) == new_value

    async def writes_read_back(store: ObjectStore) -> None:
        if not isinstance(store, WritableStore):
            return  # a read-only store (a web server): nothing to check
        key = "written/a b+c/manifest.bin"
        first, second = _blob(200_001, 5), _blob(1000, 6)
        put = await store.put(key, first)
        assert (put.key, put.size) == (key, len(first)), put
        info = await store.stat(key)
        assert info.size == len(first), info
        assert not put.etag or put.etag == info.etag, "put and stat ETags differ"
        assert bytes(await store.get(key, etag=info.etag)) == first
        assert [o.key async for o in store.list("written/")] == [key]
        again = await store.put(key, second)  # replaced whole, under a new version
        assert bytes(await store.get(key)) == second
        assert (await store.stat(key)).etag not in ("", info.etag), "a new ETag on replace"
        assert not again.etag or again.etag == (await store.stat(key)).etag

    for check in (
        listing_paginates,
        listing_prefixes,
        ranges_are_exact,
        missing_object,
        replaced_mid_read,
        writes_read_back,
    ):
        run(check)
    if fixture.open_throttled is not None:
        _check_throttling(fixture, fixture.open_throttled)
    if fixture.open_wrong_credentials is not None:
        _check_wrong_credentials(fixture, fixture.open_wrong_credentials)


def _check_throttling(
    fixture: StoreFixture,
    open_throttled: Callable[[], tuple[ObjectStore, Callable[[int, str], None]]],
) -> None:
    async def main() -> None:
        store, fail = open_throttled()
        try:
            key = "blobs/small.bin"
            info = await store.stat(key)
            fail(1, key)
            try:
                await store.get(key, etag=info.etag)
            except Throttled:
                pass
            else:
                raise AssertionError(f"{fixture.name}: a throttled GET did not raise Throttled")
            counters = Counters()
            fetcher = Fetcher(
                store, counters, FetchConfig(max_inflight=4, backoff_base=0.01, max_attempts=6)
            )
            fail(3, key)
            got = await fetcher.fetch(ObjectInfo(key, info.size, info.etag))
            assert bytes(got) == _blob(1000, 1)
            assert counters.retries["throttled"] == 3, counters.retries
            # Listing pages and HEADs are retried too (by the store or its SDK).
            fail(2, "tree")
            keys = {o.key async for o in store.list("tree/")}
            assert len(keys) == 6, keys
        finally:
            await store.close()

    asyncio.run(main())


def _check_wrong_credentials(
    fixture: StoreFixture, open_wrong: Callable[[], tuple[ObjectStore, str]]
) -> None:
    async def main() -> None:
        store, secret = open_wrong()
        try:
            for call in (_first(store), store.get("blobs/small.bin")):
                try:
                    await call
                except AccessDenied as exc:
                    text = str(exc)
                    assert fixture.account in text, f"{text!r} does not name {fixture.account}"
                    assert secret not in text
                    assert secret not in repr(exc)
                    assert len(text) < 400, "an access error should be one clear line"
                except StoreError as exc:
                    raise AssertionError(f"wrong credentials gave {exc!r}") from exc
                else:
                    raise AssertionError("wrong credentials were accepted")
        finally:
            await store.close()

    asyncio.run(main())


async def _first(store: ObjectStore) -> None:
    async for _ in store.list():
        break
