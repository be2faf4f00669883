"""The job's store (a real c10d TCPStore on 127.0.0.1): one listing per job, shared in
chunks; every rank's agreement on its object list; the digest that agreement compares."""

from __future__ import annotations

import asyncio
import datetime
import io
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.distributed import PrefixStore, TCPStore

from asyncloader import AsyncLoaderError, DecodeConfig, ListingMismatchError, ObjectInfo
from asyncloader._base import _jobstore
from asyncloader._base._jobstore import StoreAddress, store_address
from asyncloader._dataset._objects import ObjectList
from asyncloader._dataset._sizes import UNKNOWN, sample_sizes, share_name
from asyncloader._run._dist import (
    Agreement,
    StoreShare,
    here,
    listing_key,
    share_listing,
)
from asyncloader.testing import MemoryStore


@pytest.fixture
def server() -> TCPStore:
    master = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=10),
    )  # fmt: skip
    return master


def _client(server: TCPStore, prefix: str = "asyncloader/t/0") -> Any:
    tcp = TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
    return PrefixStore(prefix, tcp)


def _objects(n: int, tag: str = "") -> list[ObjectInfo]:
    return [
        ObjectInfo(f"train/c{i % 7}/img_{i:07d}{tag}.jpg", 1000 + i, f"{i:032x}") for i in range(n)
    ]


def test_the_first_process_lists_and_the_others_read_its_list(server: TCPStore) -> None:
    calls: list[int] = []

    def produce() -> list[ObjectInfo]:
        calls.append(1)
        return _objects(50)

    key = listing_key("s3://b/train/", "folder", {"endpoint_url": "http://x"})
    a = share_listing(_client(server), key, "s3://b/train/", produce)
    b = share_listing(_client(server), key, "s3://b/train/", produce)
    assert calls == [1]
    assert list(a) == list(b) == _objects(50)


def test_a_long_listing_travels_in_chunks_under_the_store_payload_limit(server: TCPStore) -> None:
    # ~20 MB of keys that do not compress: over the 8 MiB a TCPStore value may hold.
    rnd = os.urandom(250_000 * 40).hex()
    objects = [ObjectInfo(rnd[80 * i : 80 * i + 80], i, "e") for i in range(250_000)]
    store = _client(server)
    share_listing(store, "k", "u", lambda: objects)
    assert int(store.get("listing/k/done").decode().split()[1]) > 2  # chunks
    got = share_listing(_client(server), "k", "u", lambda: [])
    assert got.digest() == ObjectList.of(objects).digest()


def test_a_failed_listing_is_named_to_the_waiting_processes_and_may_be_tried_again(
    server: TCPStore,
) -> None:
    started, results = threading.Event(), []

    def fail() -> list[ObjectInfo]:
        started.set()
        time.sleep(0.3)
        raise AsyncLoaderError("no such bucket: b")

    def reader() -> None:
        started.wait(5)
        try:
            share_listing(_client(server), "k", "s3://b/", lambda: _objects(1))
        except AsyncLoaderError as exc:
            results.append(str(exc))

    t = threading.Thread(target=reader)
    t.start()
    with pytest.raises(AsyncLoaderError, match="no such bucket"):
        share_listing(_client(server), "k", "s3://b/", fail)
    t.join(10)
    assert len(results) == 1 and "listed s3://b/ failed" in results[0]
    assert "no such bucket: b" in results[0]
    # The claim is given back: the next process to need it lists again.
    assert list(share_listing(_client(server), "k", "s3://b/", lambda: _objects(3))) == _objects(3)


@pytest.mark.parametrize(
    "owner",
    [None, f"{here()} {os.getpid()}", "another-host/1 {gone}", socket.gethostname() + "/0 {gone}"],
    ids=["unnamed", "alive-here", "elsewhere", "another-pid-namespace"],
)
def test_a_listing_claimed_but_never_published_is_a_clear_error_after_the_timeout(
    server: TCPStore, owner: str | None
) -> None:
    store = _client(server)
    store.add("listing/k/claim", 1)  # a process claimed it, then hung
    if owner is not None:  # one that runs here, or one this host cannot see: elsewhere
        store.set("listing/k/owner", owner.format(gone=_gone_pid()))
    t0 = time.monotonic()
    with pytest.raises(AsyncLoaderError, match="no listing of s3://b/ reached the job's store"):
        share_listing(_client(server), "k", "s3://b/", lambda: _objects(1), timeout=1.2)
    assert time.monotonic() - t0 < 6


def _gone_pid() -> int:
    """The pid of a process that ran here and is gone (reaped: its pid runs nothing)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_a_claimer_that_died_on_this_host_is_replaced_by_one_waiter(server: TCPStore) -> None:
    """A DataLoader worker shut down while it read: a waiter of the same host notices
    within a second, makes it in its place and publishes it; no one waits for the dead."""
    store = _client(server)
    store.add("listing/k/claim", 1)
    store.set("listing/k/owner", f"{here()} {_gone_pid()}")
    made = []

    def produce(n: int) -> list[ObjectInfo]:
        made.append(n)
        return _objects(n)

    got: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda n=n: got.append(
                list(share_listing(_client(server), "k", "s3://b/", lambda: produce(n)))
            )
        )
        for n in (2, 3)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - t0 < 10
    assert len(made) == 1 and got == [_objects(made[0])] * 2  # one made it, both have it


def test_a_claimer_that_stops_without_failing_hands_the_listing_to_one_waiter(
    server: TCPStore,
) -> None:
    """A claimer interrupted while it lists (Ctrl-C, its loader closed) tells no one an
    error that is not the listing's: one waiter lists in its place and the others read
    that, wherever the claimer ran."""
    made: list[int] = []
    got: list[Any] = []
    errors: list[BaseException] = []

    def produce(n: int) -> list[ObjectInfo]:
        made.append(n)
        return _objects(n)

    def waiter(n: int) -> None:
        try:
            got.append(list(share_listing(_client(server), "k", "s3://b/", lambda: produce(n))))
        except BaseException as exc:
            errors.append(exc)

    t0 = time.monotonic()
    share = StoreShare(_client(server))
    assert share.take("listing/k", "listing of s3://b/", "listed s3://b/") is None  # claims
    threads = [threading.Thread(target=waiter, args=(n,)) for n in (2, 3)]
    for t in threads:
        t.start()
    claims = _client(server)
    asyncio.run(_claims_reach(claims, "listing/k", 3))  # both wait for it
    share.release("listing/k")  # as share_listing does when what it called is interrupted
    for t in threads:
        t.join(30)
    assert errors == [] and time.monotonic() - t0 < 10
    assert len(made) == 1 and got == [_objects(made[0])] * 2  # one made it, both have it
    # A process that asks afterwards reads it.
    assert list(share_listing(_client(server), "k", "s3://b/", lambda: [])) == _objects(made[0])


def test_share_listing_releases_its_claim_when_interrupted(server: TCPStore) -> None:
    def interrupted() -> list[ObjectInfo]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        share_listing(_client(server), "k", "s3://b/", interrupted)
    store = _client(server)
    assert store.get("listing/k/owner") == b"released" and not store.check(["listing/k/done"])
    # The next to ask lists (after one look at the owner), and is not told of an error.
    assert list(share_listing(_client(server), "k", "s3://b/", lambda: _objects(4))) == _objects(4)


async def _claims_reach(store: Any, name: str, n: int) -> None:
    """Wait (10 s at most) until ``n`` processes have asked to make ``name``."""
    for _ in range(1000):
        if int(store.add(f"{name}/claim", 0)) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} claims of {name} not seen")


def test_a_cancelled_header_pass_hands_the_sizes_to_a_waiting_process(
    server: TCPStore,
) -> None:
    """The process reading the job's headers is cancelled (its loader closed at its start):
    a process waiting for the sizes reads them itself, not an error."""
    store = MemoryStore(_jpegs(4), name="held")
    objects = _listed(store)
    name = share_name("mem://held/", objects, False)
    claims = _client(server)
    held = _HeldStore(store.bucket, lambda: False, name="held")  # reads that never end

    async def job() -> Any:
        first = asyncio.create_task(
            sample_sizes(held, objects, [None] * 4, folder=None, share=StoreShare(_client(server)))
        )
        await _claims_reach(claims, name, 1)  # the first has claimed them
        second = asyncio.create_task(
            sample_sizes(store, objects, [None] * 4, folder=None, share=StoreShare(_client(server)))
        )
        await _claims_reach(claims, name, 2)  # the second waits for them
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await asyncio.wait_for(second, 10)

    got = asyncio.run(job())
    assert got.tolist() == [[16, 8 + 4 * i] for i in range(4)]
    assert store.requests["get"] == 4  # read by the second, once each


def test_a_restarted_job_and_another_prefix_start_afresh(server: TCPStore) -> None:
    share_listing(_client(server, "asyncloader/r/0"), "k", "u", lambda: _objects(2))
    got = share_listing(_client(server, "asyncloader/r/1"), "k", "u", lambda: _objects(5))
    assert len(got) == 5


def _jpegs(n: int) -> dict[str, bytes]:
    out = {}
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", (8 + 4 * i, 16), (i, 0, 0)).save(buf, "JPEG")
        out[f"s/{i}.jpg"] = buf.getvalue()
    return out


def _sizes_in(
    server: TCPStore,
    store: MemoryStore,
    folders: list[Path | None],
    *,
    skip: bool = False,
    job: str = "asyncloader/t/0",
) -> list[Any]:
    """:func:`sample_sizes` of ``store``'s objects in as many "processes" as ``folders``
    (each its own client of the store of ``job`` and its own cache folder), at once: what
    each got, or raised."""
    objects = _listed(store)

    async def one(folder: Path | None) -> Any:
        share = StoreShare(_client(server, job))
        return await sample_sizes(
            store,
            objects,
            [None] * len(objects),
            folder=str(folder) if folder is not None else None,
            skip=skip,
            share=share,
        )

    async def every() -> list[Any]:
        return await asyncio.gather(*(one(f) for f in folders), return_exceptions=True)

    return asyncio.run(every())


def _listed(store: MemoryStore) -> ObjectList:
    async def listing() -> list[ObjectInfo]:
        return [o async for o in store.list()]

    return ObjectList.of(asyncio.run(listing()))


def test_one_process_of_the_job_reads_the_headers_and_every_other_takes_its_sizes(
    server: TCPStore, tmp_path: Path
) -> None:
    store = MemoryStore(_jpegs(6))
    folders: list[Path | None] = [tmp_path / "node0", tmp_path / "node1", None]
    got = _sizes_in(server, store, folders)
    want = [[16, 8 + 4 * i] for i in range(6)]
    assert all(g.tolist() == want for g in got), got
    assert store.requests["get"] == 6  # one header read per object, in the whole job
    # Each node kept them, also the one whose process took them from the job's store: a
    # later run on either reads no header.
    for folder in folders[:2]:
        again = asyncio.run(sample_sizes(store, _listed(store), [None] * 6, folder=str(folder)))
        assert again.tolist() == want
    assert store.requests["get"] == 6


class _HeldStore(MemoryStore):
    """A MemoryStore whose reads wait until ``ready()`` (10 s at most)."""

    def __init__(self, images: dict[str, bytes], ready: Any, *, name: str) -> None:
        super().__init__(images, name=name)
        self._ready = ready

    async def get(self, key: str, **kw: Any) -> Any:
        for _ in range(1000):  # every 10 ms
            if self._ready():
                break
            await asyncio.sleep(0.01)
        return await super().get(key, **kw)


def test_an_unreadable_header_stops_every_process_of_the_job_or_is_unknown_to_each(
    server: TCPStore, tmp_path: Path
) -> None:
    images = _jpegs(4)
    images["s/2.jpg"] = images["s/2.jpg"][:30] + bytes(100)  # its header cut short
    # Its reads wait for the second process to ask: one that asked only after the first
    # failed would rightly try again itself (the claim is given back).
    name = share_name("mem://bad/", _listed(MemoryStore(images, name="bad")), False)
    claims = _client(server)
    store = _HeldStore(images, lambda: int(claims.add(f"{name}/claim", 0)) >= 2, name="bad")
    got = _sizes_in(server, store, [None, None])
    raised = sorted(type(g).__name__ for g in got)
    assert raised == ["AsyncLoaderError", "DecodeError"], got
    told = next(g for g in got if type(g) is AsyncLoaderError)
    assert "read the image sizes of mem://bad/ failed: DecodeError" in str(told)
    assert "2.jpg" in str(told)
    # Under on_error="skip" each gets the same sizes, the unreadable one unknown; it is
    # kept nowhere, so the next run reads its header again.
    store = MemoryStore(store.bucket, name="bad")  # the same objects, read at once
    got = _sizes_in(server, store, [tmp_path / "n0", tmp_path / "n1"], skip=True)
    assert all(g.tolist()[2] == list(UNKNOWN) and g.tolist()[3] == [16, 20] for g in got), got
    assert store.requests["get"] == 4
    got = _sizes_in(server, store, [tmp_path / "n1"], skip=True, job="asyncloader/t/1")  # next job
    assert store.requests["get"] == 5


def test_listing_keys_differ_by_url_source_and_store_options() -> None:
    base = listing_key("s3://b/t/", "folder", {"endpoint_url": "http://a"})
    assert base == listing_key("s3://b/t/", None, {"endpoint_url": "http://a"})  # same LIST
    assert base != listing_key("s3://b/t/", "folder", {"endpoint_url": "http://b"})
    assert base != listing_key("s3://b/u/", "folder", {"endpoint_url": "http://a"})
    assert base != listing_key("s3://b/t/", "train.jsonl", {"endpoint_url": "http://a"})
    # A callable label policy lists the same objects as any other.
    assert listing_key("s3://b/t/", lambda k: 0, None) == listing_key("s3://b/t/", "folder", None)


def _agreement(server: TCPStore, rank: int, world: int = 2) -> Agreement:
    return Agreement(_client(server), "s3://b/train/", "n", rank, world)


def test_ranks_with_the_same_list_agree(server: TCPStore) -> None:
    a, b = _agreement(server, 0), _agreement(server, 1)
    a.announce()
    b.announce()
    done = threading.Thread(target=a.check, args=(_objects(40),))
    done.start()  # waits for rank 1, which announced itself
    time.sleep(0.2)
    assert done.is_alive()
    b.check(_objects(40))
    done.join(5)
    assert not done.is_alive()
    a.poll()
    assert a.settled and b.settled


def test_a_rank_with_another_list_is_refused_and_so_are_the_others(server: TCPStore) -> None:
    a, b = _agreement(server, 0), _agreement(server, 1)
    a.announce()
    b.announce()
    errors: list[str] = []

    def rank0() -> None:
        try:
            a.check(_objects(40))
        except ListingMismatchError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=rank0)
    t.start()
    time.sleep(0.1)
    with pytest.raises(ListingMismatchError) as refused:
        b.check([*_objects(40), ObjectInfo("train/c0/extra.jpg", 5, "e")])
    t.join(5)
    message = str(refused.value)
    assert "rank 1 of 2 has 41 objects" in message and "rank 0 has 40" in message
    assert errors == [message]  # rank 0 hears of it before its first batch


def test_a_rank_already_running_hears_of_a_refusal_at_its_next_batch(server: TCPStore) -> None:
    a = _agreement(server, 0)
    a.check(_objects(10))  # nobody else announced: it goes on at once
    assert not a.settled
    a.poll()
    with pytest.raises(ListingMismatchError):
        _agreement(server, 1).check(_objects(11))
    with pytest.raises(ListingMismatchError, match="rank 1 of 2 has 11 objects"):
        a.poll()


def test_one_rank_alone_never_waits_for_the_others(server: TCPStore) -> None:
    a = _agreement(server, 0, world=8)
    a.announce()
    t0 = time.monotonic()
    a.check(_objects(10))
    for _ in range(3):
        a.poll()
    assert time.monotonic() - t0 < 2 and not a.settled


def test_the_job_store_comes_from_torchrun_s_environment(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert store_address() == StoreAddress("127.0.0.1", server.port, "asyncloader/job7/2")
    agreement = Agreement.open("s3://b/", "folder", 0, 2)
    assert agreement is not None
    agreement.store.set("x", "1")
    assert server.check(["asyncloader/job7/2/x"])
    assert Agreement.open("s3://b/", "folder", 0, 1) is None  # one rank: nothing to check


def test_no_job_store_without_torchrun_or_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setattr(_jobstore, "_adopted", None)
    assert store_address() is None
    assert Agreement.open("s3://b/", "folder", 0, 2) is None


_info = st.builds(
    ObjectInfo,
    st.text(min_size=1, max_size=12),
    st.integers(0, 2**40),
    st.one_of(st.text(max_size=40), st.from_regex(r"[0-9a-f]{32}", fullmatch=True)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_info, max_size=30), st.lists(_info, max_size=30), st.integers(0, 30))
def test_digests_are_equal_exactly_for_equal_lists(
    a: list[ObjectInfo], b: list[ObjectInfo], cut: int
) -> None:
    whole = ObjectList.of(a)
    parts = ObjectList.concat([ObjectList.of(a[:cut]), ObjectList.of(a[cut:])])
    assert whole.digest() == parts.digest()  # however the list was made
    assert (ObjectList.of(b).digest() == whole.digest()) == (a == b)


def test_loaders_and_datasets_are_dcp_stateful_with_one_key_set(jpeg_folder: Any) -> None:
    """torch.distributed.checkpoint loads into the keys of a new object's state: a state
    has the same keys before the first batch, mid-epoch and after a load."""
    from torch.distributed.checkpoint.stateful import Stateful

    from asyncloader import ImageLoader
    from asyncloader._run._resume import KEYS
    from asyncloader.torch import ImageDataset

    ds = ImageDataset(
        str(jpeg_folder),
        batch_size=16,
        decode=DecodeConfig(workers=1),
    )
    fresh = ds.state_dict()
    assert isinstance(ds, Stateful) and tuple(fresh) == KEYS
    with ImageLoader(
        str(jpeg_folder),
        batch_size=16,
        decode=DecodeConfig(workers=1),
    ) as loader:
        assert isinstance(loader, Stateful) and tuple(loader.state_dict()) == KEYS
        for _ in zip(range(2), loader, strict=False):
            pass
        mid = loader.state_dict()
        assert tuple(mid) == KEYS and mid["next_batch"] == 2
    ds.load_state_dict(mid)
    assert ds.state_dict() == mid  # loaded, not iterated yet: where it will go on
    ds.close()
