"""The job's own c10d store: one listing (and header pass) per job, and every rank's
agreement on the listing.

Every process of a ``torchrun`` job — each rank, and each rank's DataLoader workers — can
reach the job's key-value store (where it is, and a client of it:
:mod:`asyncloader._base._jobstore`): the TCPStore of torchrun's agent, or of a process group
initialised on one.  Keys go under ``asyncloader/<run id>/<restart>``, so a restarted job
starts afresh.

Nothing here is a collective: only ``set``, ``get``, ``add``, ``compare_set``, ``check``
and ``wait``, which never need another rank to take part.  So a dataset that one rank alone
builds (validation on rank 0 while the others wait at a barrier) lists and runs at once.

* :func:`list_once`: a URL's object list, once per job (for ``ImageLoader`` and
  ``ImageDataset`` alike), through :func:`share_listing`.
* :func:`share_listing`: the first process to need a URL's listing claims it (``add``),
  lists and publishes the compact arrays, compressed, in chunks under the store's payload
  limit; the others wait for them (with a clear error after a time-out) and read them.
* :class:`StoreShare`: that claim, publish and wait, for any bytes made once per job — the
  listing, and the images' sizes that aspect-ratio buckets and size filters need (one
  header pass per job: ``asyncloader._dataset._sizes``).
* :class:`Agreement`: before its first batch a loader of a sharded run publishes the digest
  of its object list (count, keys, sizes, ETags) and compares it with the first one
  published for the URL; a rank that disagrees refuses, naming both counts, and tells the
  others through the store: ranks that started the same run wait for each other's verdict
  before their first batch, and a rank already running hears of it at its next batch (one
  round trip per batch, on a counter of the ranks that agreed, until all of them have).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import secrets
import socket
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._base._errors import AsyncLoaderError, ListingMismatchError, shown_key
from .._base._jobstore import StoreAddress, job_store
from .._base._manifest import is_columnar, is_manifest
from .._base._own_thread import run_on_own_thread
from .._base._proctree import alive
from .._base._sources import Source
from .._base._types import ObjectInfo, ObjectStore
from .._dataset import list_for
from .._dataset._combine import prefixed
from .._dataset._objects import ObjectList
from .._stores import open_store
from .._stores import store_options as store_options_for
from .._stores._mixed import MixedStore

__all__ = [
    "list_each_once",
    "LISTING_WAIT",
    "Agreement",
    "list_once",
    "listing_key",
    "listing_source",
    "share_listing",
    "StoreShare",
    "here",
]

log = logging.getLogger("asyncloader")

# How long a process waits for the listing another one claimed, and for the verdict of ranks
# that started the same run [seconds].  A listing of a million keys takes a minute or two.
LISTING_WAIT = 1800.0
# The TCPStore refuses values over 8 MiB (its libuv server's payload limit).
_CHUNK = 4 << 20
_SLICE = 0.02  # how often a waiting process looks again [seconds]
# Added to an agreement's count of ranks that agreed when one refuses: below zero for good.
_REFUSED = -(1 << 40)


def listing_source(labels: object) -> str:
    """What names a run's objects: its manifest (``labels="train.jsonl"``), or the store's
    listing (any other labels policy lists the same objects)."""
    if isinstance(labels, str) and (is_manifest(labels) or is_columnar(labels)):
        return labels
    return "listing"


def listing_key(url: str, labels: object, store_options: dict[str, Any] | None) -> str:
    """A digest naming a listing in the job's store: the URL, its source
    (:func:`listing_source`) and the store options (another endpoint may answer another
    listing).  Values that are not plain data count by their type: they cannot be compared
    across processes."""

    def plain(value: object) -> object:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"

    doc = [url, listing_source(labels), store_options or {}]
    text = json.dumps(doc, sort_keys=True, default=plain)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def list_each_once(
    url: str,
    sources: Sequence[Source] | None,
    store: ObjectStore,
    labels: object,
    given_options: dict[str, Any] | None,
    *,
    folder: str | None,
    max_age: float,
    job: Any | None,
) -> Sequence[ObjectInfo]:
    """:func:`list_once` of ``url``, or of each of several ``sources`` (``store``: their
    :class:`~asyncloader._stores._mixed.MixedStore`): then every object keyed by its URL,
    as the mix names it (its listing splits them again by source)."""
    if not sources:
        return list_once(url, labels, given_options, folder=folder, max_age=max_age, job=job)
    assert isinstance(store, MixedStore)
    each = [
        list_once(s.url, s.labels, s.store_options, folder=folder, max_age=max_age, job=job)
        for s in sources
    ]
    parts = zip(each, store.stores, strict=True)
    return ObjectList.concat([prefixed(ObjectList.of(o), part.url) for o, part in parts])


def list_once(
    url: str,
    labels: object,
    given_options: dict[str, Any] | None,
    *,
    folder: str | None,
    max_age: float,
    job: Any | None,
) -> Sequence[ObjectInfo]:
    """The object list of ``url`` with ``labels``, listed once per job: by this process
    if it is the first of ``job`` (the job's store, or None: no job) to need it, else read
    from the job's store where the first published it.  Listed as a loader lists (a
    manifest's objects, the saved listing in ``folder`` younger than ``max_age``, else the
    store's), with a store of its own on a thread of its own (a loop may run here).

    Raises:
        StoreError: the store could not be listed.
    """
    options = store_options_for(url, labels, given_options)

    async def listed() -> Sequence[ObjectInfo]:
        store = open_store(url, **options)
        try:
            return await list_for(
                store, labels, folder=folder, max_age=max_age, store_options=options
            )
        finally:
            await store.close()

    def produce() -> Sequence[ObjectInfo]:
        return run_on_own_thread(listed())

    if job is None:
        return produce()
    return share_listing(job, listing_key(url, labels, given_options), url, produce)


def _encode(objects: ObjectList) -> bytes:
    buf = io.BytesIO()
    arrays: dict[str, Any] = objects.arrays()
    np.savez(buf, **arrays)
    return zlib.compress(buf.getvalue(), 1)


def _decode(data: bytes) -> ObjectList:
    with np.load(io.BytesIO(zlib.decompress(data)), allow_pickle=False) as doc:
        return ObjectList.from_arrays(doc)


def share_listing(
    store: Any,
    key: str,
    what: str,
    produce: Callable[[], Sequence[ObjectInfo]],
    *,
    timeout: float = LISTING_WAIT,
) -> ObjectList:
    """The listing named ``key``: made by ``produce()`` in the first process of the job to
    ask, published through ``store``, and read from there by every other.  ``what``
    names it in messages (the URL).

    Raises:
        AsyncLoaderError: the process that claimed the listing failed (its error is
            named), or published nothing within ``timeout`` [seconds].
        Whatever ``produce`` raises, in the process that lists.
    """
    share = StoreShare(store, timeout=timeout)
    name = f"listing/{key}"
    data = share.take(name, f"listing of {what}", f"listed {what}")
    if data is not None:
        return _decode(data)
    try:
        objects = ObjectList.of(produce())
    except Exception as exc:
        share.fail(name, exc)
        raise
    except BaseException:  # interrupted, cancelled: not the listing's failure
        share.release(name)
        raise
    share.publish(name, _encode(objects))
    return objects


class _TakenOver(Exception):
    """The claimer died, or stopped before it published: this process claimed its name in
    its place (the exception's text says which)."""


def here() -> str:
    """This process's host as a claim's owner names it: the host name and the PID namespace
    (containers that share a host name may not see each other's processes)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux: the host name alone
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"


class StoreShare:
    """What one process of the job makes and every other reads, through the job's store
    (a :class:`~asyncloader._dataset._sizes.JobShare`): the first to :meth:`take` a name
    makes it and :meth:`publish` es its bytes (or :meth:`fail` s, naming its error); the
    others wait in :meth:`take` and get them.  Large values travel in chunks under the
    store's payload limit.  A claimer that dies on the waiter's own host (a DataLoader
    worker shut down while it read) is noticed, and one waiter makes it instead: no wait
    for a process that is gone.  So is one that stops before it publishes without failing
    (interrupted, or its loader closed while it listed: :meth:`release`), wherever it ran.

    Args:
        store: A c10d ``Store`` (under this package's prefix), or the address of the job's
            store (a client is made on first use, in the process that uses it).
        timeout: How long :meth:`take` waits for the claimer [seconds].
    """

    _LOOK = 0.5  # how often a waiter asks whether the claimer still runs [seconds]
    _RELEASED = "released"  # the owner of a name whose claimer stopped before it published

    def __init__(self, store: Any, *, timeout: float = LISTING_WAIT) -> None:
        self._store = store
        self.timeout = timeout
        self._mine: dict[str, str] = {}  # the names this process makes: its owner text

    def __getstate__(self) -> dict[str, Any]:
        if not isinstance(self._store, StoreAddress):
            raise TypeError("a StoreShare made on a store client stays in its process")
        return {"_store": self._store, "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._store, self.timeout = state["_store"], state["timeout"]
        self._mine = {}

    @property
    def store(self) -> Any:
        """The store's client in this process (made here on first use).

        Raises:
            AsyncLoaderError: the job's store cannot be reached.
        """
        if isinstance(self._store, StoreAddress):
            return job_store(self._store)
        return self._store

    def take(self, name: str, what: str, doing: str) -> bytes | None:
        """None where this process is to make ``name`` (the first of the job to ask, or
        in the place of a claimer that died or stopped), else the bytes another published, once it
        has (``what`` names them in messages, ``doing`` what the claimer did: "listing
        of s3://b/", "listed s3://b/").

        Raises:
            AsyncLoaderError: the claimer failed (its error is named), or published nothing
                within :attr:`timeout`.
        """
        store, done = self.store, f"{name}/done"
        me = f"{here()} {os.getpid()} {secrets.token_hex(4)}"  # this take
        if store.add(f"{name}/claim", 1) == 1:
            store.set(f"{name}/owner", me)
            if store.check([done]):  # a failed attempt before this one: start afresh
                store.delete_key(done)
            self._mine[name] = me
            return None
        looked = [time.monotonic()]

        def orphaned() -> None:  # between looks: has the claimer died here, or stopped?
            if time.monotonic() - looked[0] < self._LOOK:
                return
            looked[0] = time.monotonic()
            owner_key = f"{name}/owner"
            if not store.check([owner_key]):
                return
            owner = store.get(owner_key).decode()
            if owner == self._RELEASED:
                why = "stopped before it published it"
            else:
                host, pid, *_ = [*str(owner).split(), "", ""]
                if host != here() or not pid.isdigit() or alive(int(pid)):
                    return
                why = "died"
            # One waiter wins the owner's place; the others go on waiting for its bytes.
            if store.compare_set(owner_key, owner, me).decode() == me:
                self._mine[name] = me
                raise _TakenOver(why)

        try:
            _wait_for(
                store,
                [done],
                self.timeout,
                lambda: (
                    f"no {what} reached the job's store within {self.timeout:.0f} s: the "
                    "process that claimed it (the first of the job to need it) did not "
                    "publish it"
                ),
                orphaned,
            )
        except _TakenOver as why:
            log.warning(
                "asyncloader: the process that claimed the %s %s; making it here", what, why
            )
            return None
        status = store.get(done).decode()
        if status.startswith("error"):
            raise AsyncLoaderError(f"the process of this job that {doing} failed: {status[6:]}")
        n = int(status.split()[1])
        return b"".join(store.get(f"{name}/{i}") for i in range(n))

    def publish(self, name: str, data: bytes) -> None:
        """``data``, made for ``name`` by the process that took it to make, to every other."""
        store = self.store
        chunks = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b""]
        for i, chunk in enumerate(chunks):
            store.set(f"{name}/{i}", chunk)
        store.set(f"{name}/done", f"ok {len(chunks)}")  # last: readers wait for it
        self._mine.pop(name, None)

    def fail(self, name: str, error: BaseException) -> None:
        """The maker of ``name`` failed with ``error``: the processes waiting for it are
        told, and the next to ask claims it again."""
        store = self.store
        store.set(f"{name}/done", f"error {type(error).__name__}: {error}"[:4000])
        store.delete_key(f"{name}/claim")
        self._mine.pop(name, None)

    def release(self, name: str) -> None:
        """The maker of ``name`` stopped before it finished, without failing (interrupted,
        cancelled: its loader closed while it made it): one process waiting for it makes
        it instead, or else the next to ask.  Its waiters are not told of an error that is
        not the name's own.  Nothing where this process does not hold ``name`` (any more)."""
        me = self._mine.pop(name, None)
        if me is None:
            return
        try:
            self.store.compare_set(f"{name}/owner", me, self._RELEASED)
        except Exception as exc:  # the store gone too: what stopped this one goes on
            log.debug("asyncloader: could not release the claim on %s: %r", name, exc)


def _wait_for(
    store: Any,
    keys: list[str],
    timeout: float,
    message: Callable[[], str],
    stop: Callable[[], object] | None = None,
) -> None:
    """Wait until every key of ``keys`` is in ``store``; ``stop()`` (called between looks)
    may raise to end the wait early.

    Raises:
        AsyncLoaderError: ``message()`` after ``timeout`` [seconds].
    """
    deadline = time.monotonic() + timeout
    while not store.check(keys):
        if stop is not None:
            stop()
        if time.monotonic() > deadline:
            raise AsyncLoaderError(message())
        time.sleep(_SLICE)


class Agreement:
    """One loader's check that every rank of a sharded run holds the same object list.

    ``announce()`` when the run starts (before listing), ``check(objects)`` before the first
    batch, ``poll()`` before each later one until every rank has agreed.
    """

    def __init__(self, store: Any, url: str, name: str, rank: int, world_size: int) -> None:
        self._store = store
        self._url = shown_key(url)  # as messages show it: a credential in it hidden
        self._base = f"agree/{name}"
        self.rank = rank
        self.world_size = world_size
        self.settled = False

    @classmethod
    def open(cls, url: str, labels: object, rank: int, world_size: int) -> Agreement | None:
        """The check of a run over ``url`` with ``labels`` (see :func:`listing_source`) for
        ``rank`` of ``world_size``, or None where there is nothing to check (one rank, no
        job store).

        Raises:
            AsyncLoaderError: the job's store cannot be reached.
        """
        if world_size <= 1:
            return None
        store = job_store()
        if store is None:
            return None
        doc = json.dumps([url, listing_source(labels)])
        return cls(store, url, hashlib.sha256(doc.encode()).hexdigest()[:32], rank, world_size)

    @property
    def store(self) -> Any:
        """The job's store (a c10d ``Store`` under this package's prefix)."""
        return self._store

    def announce(self) -> None:
        """Tell the other ranks that this one runs over the URL: they wait for its verdict
        before their first batch."""
        self._store.set(f"{self._base}/started/{self.rank}", "1")

    def _verdict(self) -> int:
        """How many ranks have agreed so far (one round trip).

        Raises:
            ListingMismatchError: a rank refused its list.
        """
        verdict = int(self._store.add(f"{self._base}/verdict", 0))
        if verdict < 0:
            raise ListingMismatchError(self._store.get(f"{self._base}/refused").decode())
        return verdict

    def check(self, objects: Sequence[ObjectInfo], *, timeout: float = LISTING_WAIT) -> None:
        """Publish this rank's digest and compare it with the job's first; then wait for
        the verdict of every rank that has announced itself.

        Raises:
            ListingMismatchError: this rank's list differs from the first published one,
                or another rank refused; the message names both counts.
            AsyncLoaderError: an announced rank gave no verdict within ``timeout``.
        """
        listed = ObjectList.of(objects)
        mine = f"{len(listed)} {listed.digest()}"
        store, base = self._store, self._base
        self._verdict()
        ref = store.compare_set(f"{base}/ref", "", f"{self.rank} {mine}").decode()
        ref_rank, ref_count, ref_digest = ref.split()
        if f"{ref_count} {ref_digest}" != mine:
            message = (
                f"the ranks of this job hold different object lists for {self._url}: rank "
                f"{self.rank} of {self.world_size} has {len(listed)} objects "
                f"(digest {mine.split()[1][:12]}), rank {ref_rank} has {ref_count} "
                f"(digest {ref_digest[:12]}). Sharding them would read some samples twice "
                "and others never. Each listed the store itself and saw it at another "
                "moment or through another endpoint: share one listing (ImageDataset, or "
                "ImageLoader under torchrun, lists once per job when every rank passes the "
                "same URL and options), or name the objects in a manifest "
                "(asyncloader ls --write-manifest) or with objects=."
            )
            store.compare_set(f"{base}/refused", "", message)
            store.add(f"{base}/verdict", _REFUSED)  # after the message: readers find it
            raise ListingMismatchError(message)
        if store.add(f"{base}/ok/{self.rank}", 1) == 1:  # this rank's first loader to agree
            store.add(f"{base}/verdict", 1)
        started = [
            r
            for r in range(self.world_size)
            if r != self.rank and store.check([f"{base}/started/{r}"])
        ]
        _wait_for(
            store,
            [f"{base}/ok/{r}" for r in started],
            timeout,
            lambda: (
                f"ranks {started} of this job started reading {self._url} but did not "
                f"check their object lists within {timeout:.0f} s"
            ),
            stop=self._verdict,
        )
        self.poll()

    def poll(self) -> None:
        """Between batches, until every rank has agreed: a refusal raises here.

        Raises:
            ListingMismatchError: a rank refused its list.
        """
        if not self.settled:
            self.settled = self._verdict() >= self.world_size
