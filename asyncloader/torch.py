"""PyTorch face: an ``IterableDataset`` over the loader, sharded across ranks and workers.

::

    ds = ImageDataset("s3://bucket/train/", batch_size=256, transform=RandomResizedCrop(224))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for images, labels in dl:
            ...

With ``device="cuda"`` (and ``dtype``, ``output=OutputConfig(...)``) batches arrive on the
GPU already normalised, when the dataset is iterated in the training process
(``num_workers=0``, or directly).  With DataLoader workers, leave ``device`` out of the
dataset and wrap the DataLoader: ``for images, labels in to_device(dl, device="cuda")``.

The dataset lists the URL once per job: under torchrun (or a process group on a TCPStore)
the first process of the job that makes a dataset of the URL lists it and publishes the
list through the job's own c10d store, and every other rank reads it there; its DataLoader
workers get the list with the dataset.  No collective runs in the constructor or the
iterator, so a dataset that one rank alone makes (validation on rank 0 while the others
wait at a barrier) runs at once.  Before the first batch, every rank of a sharded run
checks that it holds the same object list as the others: ranks that listed different
objects (another endpoint, a store that changed between two listings) are refused with
:class:`~asyncloader.ListingMismatchError`, on every rank.

Checkpoints: :class:`ImageDataset` (iterated in the training process) and
:class:`~asyncloader.ImageLoader` are ``torch.distributed.checkpoint`` ``Stateful``
objects; with DataLoader workers, save :class:`DataLoaderState` of a torchdata
``StatefulDataLoader``.  Loaded on another number of ranks or workers, the rest of the
epoch is dealt among them: every sample not yet seen, once.

The shard is ``(rank, world size)`` from ``torch.distributed`` when it is initialised, else
from the torchrun environment (``RANK``, ``WORLD_SIZE``), times the DataLoader worker. Every
rank sees the same number of batches per epoch (``even="pad"`` repeats samples to fill the
last round; see the sampler), and a DataLoader's round-robin over its workers yields the
rank's batches in order. The loader, its threads and its connections are created lazily in
the process that iterates, so both the fork and the spawn start methods work; with
``persistent_workers=True`` the workers, started once, still run the epoch ``set_epoch``
chose in the training process (they read it, in shared memory, as each epoch starts), and
take a state ``load_state_dict`` was given there once, at their next iteration.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Unpack, cast

import torch
from torch.utils.data import IterableDataset, get_worker_info

from asyncloader import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Buckets,
    CacheConfig,
    DecodeConfig,
    ErrorConfig,
    ImageLoader,
    LoaderOptions,
    ObjectCache,
    ObjectInfo,
    ShardConfig,
    Source,
    StoreConfig,
    merge_worker_states,
    shard_from_env,
)
from asyncloader._base._jobstore import (
    adopt_store_address,
    adopted,
    job_store,
    own_store,
    store_address,
)
from asyncloader._base._scalars import Point
from asyncloader._base._worker_exit import let_feeders_finish_at_exit
from asyncloader._base._worker_resume import WorkerResume
from asyncloader._device._device_spec import DeviceSpec
from asyncloader._device._upload import Uploader
from asyncloader._loader._health import WorkerPoints
from asyncloader._run._cache_fill import CacheHeads
from asyncloader._run._dist import Agreement, StoreShare, list_once
from asyncloader._run._job import Dataset, job_dataset, rank_batches
from asyncloader._run._resume import epoch_start, every_key, has_position

__all__ = ["DataLoaderState", "ImageDataset", "dist_shard", "rank_state", "to_device"]

Batch = tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]]]
"""``(images, labels)``, or ``(images, labels, extras)`` with ``extras=``."""


def _urls(sources: Source | Sequence[str | Source]) -> list[str]:
    given = [sources] if isinstance(sources, Source) else list(sources)
    return [s.url if isinstance(s, Source) else s for s in given]


def dist_shard() -> tuple[int, int]:
    """(rank, world size): torch.distributed if initialised, else torchrun's env, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return shard_from_env()


def _list_once(url: str, options: LoaderOptions) -> Sequence[ObjectInfo]:
    """The URL's object list, once per job, as the loaders of these options list it."""
    config = options.get("cache") or CacheConfig()
    cache = ObjectCache.opened(options.get("cache_dir"), config)
    store = options.get("store") or StoreConfig()
    return list_once(
        url,
        options.get("labels", "folder"),
        dict(store.options),
        folder=cache.directory if cache is not None else None,
        max_age=config.max_age,
        job=job_store(),
    )


def _shared_copy(t: torch.Tensor) -> torch.Tensor:
    # Allocated in shared memory directly: ``empty().share_memory_()`` would first copy the
    # uninitialised bytes into a new segment (about a third more time per batch).
    storage = torch.UntypedStorage._new_shared(t.nbytes)  # type: ignore[no-untyped-call]
    out = torch.empty(0, dtype=t.dtype).set_(storage).view(t.shape)
    out.copy_(t)
    return out


class ImageDataset(IterableDataset[Batch]):
    """Ready batches ``(uint8 [B,C,H,W], int64 [B])`` of this rank's and worker's shard.

    Args:
        url: As for :class:`~asyncloader.ImageLoader`.
        **options: Every :class:`~asyncloader.ImageLoader` keyword but ``rank`` and
            ``world_size`` (from ``torch.distributed`` or the torchrun environment), typed
            (:class:`~asyncloader.LoaderOptions`); ``ShardConfig``'s ``worker`` and
            ``num_workers`` are the DataLoader's.  ``DecodeConfig(workers=)`` defaults to
            the node's CPU budget per rank divided among DataLoader workers.

    Raises:
        TypeError: ``rank``, ``world_size``, or a shard's worker given (the dataset sets
            them), or a keyword the loader does not have.
        AsyncLoaderError: the URL cannot be listed (raised here, where the dataset is made).
    """

    def __init__(
        self, url: str | Source | Sequence[str | Source], **options: Unpack[LoaderOptions]
    ) -> None:
        unknown = set(options) - set(LoaderOptions.__annotations__)
        if unknown & {"rank", "world_size"}:
            raise TypeError("rank and world_size are set by the dataset (torch.distributed/env)")
        if unknown:
            raise TypeError(f"ImageDataset() got unexpected keyword arguments {sorted(unknown)}")
        shard = options.get("shard")
        if shard is not None and (shard.worker, shard.num_workers) != (0, 1):
            raise TypeError("shard.worker and shard.num_workers are set by the dataset itself")
        self.url = url
        self.options = options
        rank, world = dist_shard()
        # Where DataLoader workers find the job's store when no torchrun names it.
        self._store_address = store_address()
        # Outside any job, a store of the dataset's own where its images' sizes are read
        # (buckets, size filters): its loaders (the training process's count, each
        # DataLoader worker's) read each header once between them.
        self._own_store: Any = None
        wants_sizes = options.get("buckets") is not None or options.get("filters") is not None
        if self._store_address is None and wants_sizes:
            made = own_store()
            if made is not None:
                self._own_store, self._store_address = made
        one = isinstance(url, str)  # else several sources: each listed where it is read
        name = url if isinstance(url, str) else " + ".join(_urls(url))
        agreement = Agreement.open(name, options.get("labels", "folder"), rank, world)
        if agreement is not None:
            agreement.announce()
        store = options.get("store") or StoreConfig()
        if one and store.objects is None and store.object_store is None:
            store = dataclasses.replace(store, objects=_list_once(name, options))
            options["store"] = store
        if agreement is not None and store.objects is not None:
            agreement.check(store.objects)  # every rank holds the same list
        self.epoch = 0
        # A state load_state_dict was given, for the next iteration here or in DataLoader
        # workers (those started later, and those already running: persistent_workers).
        self._resume = WorkerResume()
        self._loader: ImageLoader | None = None
        self._pid = -1
        self._dataset: Dataset | None = None  # the samples, once asked for (classes, len)
        # In shared memory, so that DataLoader workers (forked or spawned: the tensor travels
        # by handle) can tell the training process that they delivered batches of an epoch:
        # epoch + 1, 0 before any.  Its state_dict() cannot see how far they got.
        flag = torch.zeros(1, dtype=torch.int64)
        self._workers_in = flag.share_memory_()  # type: ignore[no-untyped-call]
        # The epoch set_epoch chose in the training process, + 1 (0: never called), in shared
        # memory the same way: persistent workers, started once, keep their copy of the
        # dataset, and read it there as each epoch starts.
        asked = torch.zeros(1, dtype=torch.int64)
        self._asked_epoch = asked.share_memory_()  # type: ignore[no-untyped-call]
        self._worker_points = WorkerPoints()  # their loaders' counts, for LoaderLogger

    def __getstate__(self) -> dict[str, Any]:
        # Workers get the recipe, never a live loader (threads and sockets do not travel).
        state = self.__dict__.copy()
        state["_loader"] = None
        state["_own_store"] = None  # the server stays here; workers reach it by address
        state["_pid"] = -1
        state["_dataset"] = None  # the training process's: a worker's loader lists its own
        return state

    def _samples(self) -> Dataset:
        """The samples its loaders read (as their engines build them from the job's
        listing), made once in this process when asked for."""
        if self._dataset is None:
            o = self.options
            config = o.get("cache") or CacheConfig()
            store = o.get("store") or StoreConfig()
            cache = ObjectCache.opened(o.get("cache_dir"), config)
            self._dataset = job_dataset(
                self.url,
                o.get("labels", "folder"),
                dict(store.options),
                store.extensions,
                extras=tuple(o.get("extras", ())),
                samples_per_epoch=o.get("samples_per_epoch"),
                filters=o.get("filters"),
                buckets=o.get("buckets") is not None,
                upright=(o.get("decode") or DecodeConfig()).exif_orientation,
                skip_unreadable=(o.get("errors") or ErrorConfig()).on_error == "skip",
                share_sizes=StoreShare(a) if (a := self._store_address) is not None else None,
                cached=(
                    CacheHeads(cache, scaled=config.scaled_jpegs) if cache is not None else None
                ),
                folder=cache.directory if cache is not None else None,
                max_age=config.max_age,
                objects=store.objects,
            )
        return self._dataset

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names, index = label, as its loaders label the samples (ImageFolder's
        folders, a manifest's or a column's sorted text labels; ``()`` for numbers): the
        size of a classifier's head is ``len(ds.classes)``."""
        return self._samples().classes

    def __len__(self) -> int:
        """The batches this rank's ``DataLoader(ds, batch_size=None)`` yields per epoch —
        what ``len(dataloader)`` and a schedule's ``steps_per_epoch`` need — whatever the
        DataLoader's worker count (its workers deal the rank's batches): this rank's share
        of the epoch (``samples_per_epoch`` or every sample; equal for every rank under
        ``ShardConfig(even=)``), cut into batches (``drop_last``)."""
        o = self.options
        rank, world = dist_shard()
        return rank_batches(
            self._samples(),
            batch_size=o.get("batch_size", 256),
            shuffle=o.get("shuffle", True),
            rank=rank,
            world_size=world,
            shard=o.get("shard") or ShardConfig(),
            samples_per_epoch=o.get("samples_per_epoch"),
            buckets=Buckets.of(o.get("buckets")),
            seed=o.get("seed", 0),
            epoch=self.epoch,
        )

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (order and augmentation): here, and in
        DataLoader workers already running (``persistent_workers=True``) when they start
        their next epoch."""
        self.epoch = epoch
        if get_worker_info() is None:
            self._asked_epoch[0] = epoch + 1

    def _get_loader(self) -> ImageLoader:
        if self._loader is not None and self._pid == os.getpid():
            return self._loader
        rank, world = dist_shard()
        info = get_worker_info()
        if info is not None and self.options.get("device") is not None:
            raise ValueError(
                "device= belongs to the training process, not DataLoader workers: drop it "
                "from the dataset and iterate asyncloader.torch.to_device(dataloader, "
                "device=...)"
            )
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            adopt_store_address(self._store_address)
            let_feeders_finish_at_exit()  # a spawned worker's exit: see the module
        options = LoaderOptions(**self.options)
        shard = options.get("shard") or ShardConfig()
        options["shard"] = dataclasses.replace(shard, worker=worker, num_workers=workers)
        with adopted(self._store_address):  # its engine shares the images' sizes there
            self._loader = ImageLoader(self.url, rank=rank, world_size=world, **options)
        self._pid = os.getpid()
        return self._loader

    def __iter__(self) -> Iterator[Batch]:
        loader = self._get_loader()
        info = get_worker_info()
        asked = int(self._asked_epoch[0])
        if info is not None and asked > 0:  # the training process's latest set_epoch
            self.epoch = asked - 1
        resume = self._resume.take(info.id if info is not None else None, self.epoch)
        if resume is not None:
            loader.load_state_dict(resume)
            self.epoch = loader.epoch  # the state's, or the next where it had finished it
        else:  # none, or set_epoch chose another epoch since: that epoch, from its start
            loader.set_epoch(self.epoch)
        epoch = self.epoch
        delivered = False
        points = self._worker_points
        for got in loader:
            if info is not None:
                self._workers_in[0] = epoch + 1  # the same value from every worker
                if not delivered:  # the training process forgets a state taken here
                    self._resume.delivered()
                    delivered = True
                if points.due():
                    points.write(info.id, loader.health_point())
                # A DataLoader worker hands results to its parent process: copy them once,
                # straight into shared memory (torch would copy a private tensor into shared
                # memory again when it pickles it), and let go of the ring slot at once.
                got = cast(Batch, (_shared_copy(got[0]), _shared_copy(got[1]), *got[2:]))
            # No reference stays in this frame while it waits at `yield`: the batch keeps
            # its ring slot only as long as the consumer keeps it.
            batch = [got]
            del got
            yield batch.pop()
        if info is not None:
            points.write(info.id, loader.health_point())  # the epoch's last counts

    def health_point(self) -> Point:
        """What this rank's loaders have counted now: its own loader's (iterated in this
        process), or its DataLoader workers' together (what they last left in shared
        memory, at most half a second old); what :class:`~asyncloader.LoaderLogger` reads."""
        if self._loader is not None and self._pid == os.getpid():
            return self._loader.health_point()
        return self._worker_points.combined()

    def state_dict(self) -> dict[str, Any]:
        """This process's position (a DataLoader worker's own, under StatefulDataLoader).

        Raises:
            RuntimeError: called in the training process while DataLoader workers iterate
                this epoch: where they are is known to the DataLoader only.  Use torchdata's
                ``StatefulDataLoader`` (its ``state_dict()`` holds every worker's position)
                or ``num_workers=0``.
        """
        pending = self._resume.pending()
        if pending is not None and int(pending["epoch"]) == self.epoch:
            return every_key(pending)  # loaded, not iterated yet: where it will go on
        if self._loader is None:
            in_worker = get_worker_info() is not None  # not started yet: at batch 0
            if not in_worker and int(self._workers_in[0]) == self.epoch + 1:
                raise RuntimeError(
                    f"ImageDataset.state_dict() in the training process cannot see how far "
                    f"the DataLoader workers got in epoch {self.epoch}: resuming from it "
                    "would deliver their batches again.  Iterate it with "
                    "torchdata.stateful_dataloader.StatefulDataLoader(dataset, "
                    "batch_size=None, num_workers=...) and save its state (it holds every "
                    "worker's position; in a torch.distributed.checkpoint, save "
                    "asyncloader.torch.DataLoaderState(dataloader)), or iterate with "
                    "num_workers=0."
                )
            return epoch_start(self.epoch)
        return self._loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` on the next iteration (checked against this shard then).

        ``state`` is this dataset's (or an :class:`~asyncloader.ImageLoader`'s) state, or a
        whole ``StatefulDataLoader.state_dict()``.  From the latter, the rank's position is
        merged from its workers' states, so the job may resume on another DataLoader worker
        count (and another world size) than it saved on: load it here and iterate a *new*
        ``StatefulDataLoader`` (or ``DataLoader``) that was not given the state itself —
        torchdata's own ``load_state_dict`` needs the same worker count.

        Raises:
            ValueError: a StatefulDataLoader state whose workers' states cannot be merged.
        """
        state = rank_state(state)
        self.set_epoch(int(state["epoch"]))  # workers already running go on from it too
        self._resume.load(
            state if has_position(state) else None, worker=get_worker_info() is not None
        )

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()
            self._loader = None


def rank_state(state: dict[str, Any]) -> dict[str, Any]:
    """The rank's loader state in ``state``: a torchdata ``StatefulDataLoader.state_dict()``
    of an :class:`ImageDataset` (its workers' states merged with
    :func:`asyncloader.merge_worker_states`: the DataLoader took their batches in turn), or
    a loader state, returned as it is.  Before any batch was delivered it is the epoch's
    start (``epoch`` and ``next_batch`` 0, every other key None).

    Raises:
        ValueError: the workers' states cannot be merged (different runs or ranks).
    """
    if "_snapshot" in state:  # num_workers > 0: one state per worker, as last delivered
        snapshot = state["_snapshot"]
        workers = [w.get("dataset_state") or {} for w in snapshot["_worker_snapshots"].values()]
        if not any(has_position(w) for w in workers):
            epochs = [int(w["epoch"]) for w in workers if "epoch" in w]
            return epoch_start(min(epochs, default=0))
        later = int(state.get("_steps_since_snapshot") or 0)
        return merge_worker_states(workers, later_batches=later)
    if "_num_yielded" in state:  # num_workers=0: the dataset's own state
        inner = state.get("_dataset_state")
        return dict(inner) if inner else epoch_start(0)
    return state


class DataLoaderState:
    """The data position of a rank whose :class:`ImageDataset` runs in DataLoader workers,
    as a ``torch.distributed.checkpoint`` ``Stateful``::

        dl = StatefulDataLoader(ds, batch_size=None, num_workers=4)  # torchdata
        dcp.save({"model": model, "optim": optim, "data": DataLoaderState(dl)}, ...)
        ...
        state = {"model": model, "optim": optim, "data": DataLoaderState(dl)}
        dcp.load(state, ...)   # then iterate dl: it resumes where the job stopped

    ``state_dict()`` merges the workers' positions into the rank's (:func:`rank_state`),
    with the same keys whatever it holds, so a checkpoint saved on one number of ranks and
    workers loads on another.  ``load_state_dict`` hands it to the dataset, whose next
    iteration (by ``dl``, which must not be given the state itself: torchdata's
    ``load_state_dict`` needs the same worker count) resumes there.

    Args:
        dataloader: A torchdata ``StatefulDataLoader`` (or a DataLoader with
            ``num_workers=0``) over an :class:`ImageDataset`.
    """

    def __init__(self, dataloader: Any) -> None:
        if not isinstance(dataloader.dataset, ImageDataset):
            raise TypeError("DataLoaderState needs a DataLoader over an ImageDataset")
        self.dataloader = dataloader

    def state_dict(self) -> dict[str, Any]:
        dl = self.dataloader
        dataset: ImageDataset = dl.dataset
        # A StatefulDataLoader that has not started iterating would start its workers to
        # answer (torchdata's state_dict makes an iterator), before a checkpoint is loaded
        # into the dataset (dcp.load asks for this state first): the dataset's own state
        # is the rank's then.
        started = getattr(dl, "_iterator", None) is not None
        saver = getattr(dl, "state_dict", None)
        state = rank_state(saver()) if saver is not None and started else dataset.state_dict()
        return every_key(state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        dl = self.dataloader
        dl.dataset.load_state_dict(state_dict)
        if getattr(dl, "_iterator", None) is not None:
            # Workers started before the state came would not have it: start anew.
            dl._iterator = None


def to_device(
    batches: Iterable[Batch],
    device: str = "cuda",
    *,
    dtype: str = "float32",
    mean: Sequence[float] | None = IMAGENET_MEAN,
    std: Sequence[float] | None = IMAGENET_STD,
    channels_last: bool = False,
    depth: int = 2,
) -> Iterator[Batch]:
    """Batches of uint8 images (a DataLoader over :class:`ImageDataset`, say) delivered on
    ``device``, converted and normalised, by the loader's uploader thread ``depth`` ahead
    (the same arithmetic as ``ImageLoader(device=...)``; on a GPU, on its own CUDA stream).
    Use ``DataLoader(..., pin_memory=True)`` so the copies are asynchronous.  A batch's
    extras (``extras=``) come through as they are."""
    spec = DeviceSpec.make(device, dtype, mean, std, channels_last)
    uploader = Uploader(spec, depth=depth, pin="auto")
    source = ((got[0], got[1], got[2:]) for got in batches)
    for images, labels, rest in uploader.run(source):
        batch = [cast(Batch, (images, labels, *rest))]
        del images, labels, rest  # no reference kept here while waiting at `yield`
        yield batch.pop()
