"""ImageLoader: options → a plan, its engine (processes of its own, :mod:`._engines`, or a
thread of this process, :mod:`._inline`), the sync consumer, resume state.

The consumer (the user's thread) waits for batches in short slices and checks liveness each
time, so end of epoch, a dead engine, a closed loader, a time-out and a consumer that holds
every ring slot are different outcomes, each with its own message.  Where the run stands
(epoch, next batch, span) is kept here, whoever makes the batches.

Lifetime: ``close()`` (or ``with``, or garbage collection, or interpreter exit) closes the
engine: production, the decode workers and the loop stop, and the shared memory goes last
(once no batch handed out references it any more).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from .._base._config import (
    CacheConfig,
    EngineConfig,
    FetchConfig,
    OnError,
    OutputConfig,
    RunConfig,
    ShardConfig,
)
from .._base._errors import ClosedError
from .._base._sources import Source
from .._base._stats import Counters, Stats
from .._base._types import DecodeFn, ObjectInfo, ObjectStore
from .._dataset._labels import IMAGE_EXTENSIONS, Dataset, LabelSpec
from .._decode._transforms import Transform
from ._assembly import start_engine
from ._build import DecodeBackend, engine_placement, fold_moved, open_cache, open_the_store, plan
from ._consumer import Batch, Consumer
from ._control import Engine, EngineSpec, NoEngine, close_engine
from ._dist import Agreement, list_each_once
from ._position import Position
from ._sampler import num_batches

if TYPE_CHECKING:
    import torch

    from .._device._upload import Uploader

__all__ = ["ImageLoader"]

T = TypeVar("T")


class ImageLoader:
    """Stream a folder of images from a store into uint8 batches ``[B, C, H, W]``.

    ::

        with ImageLoader("s3://bucket/train/", batch_size=256,
                         transform=RandomResizedCrop(224)) as loader:
            for epoch in range(3):
                loader.set_epoch(epoch)
                for images, labels in loader:   # uint8 [B,3,224,224], int64 [B]
                    ...

    Fetch, cache fill and decode run in engine processes (``EngineConfig``): this process
    maps their rings, hands the batches out in order and gives each slot back when its
    batch is gone.  ``EngineConfig(mode="inline")`` runs it all on a thread of this
    process instead.

    The tensors of a batch are views of a ring slot (no copy): the slot is reused only once
    the last reference to the batch — the tensors, and any view or array made from them —
    is gone, so a batch kept stays intact.  Every batch kept holds a slot, though: when the
    consumer holds all of them, the next batch cannot be made and the request fails with
    :class:`~asyncloader.BatchesHeldError` after a few seconds; ``clone()`` what you keep
    for long.

    Args:
        url: ``s3://bucket/prefix/``, ``file:///path/`` or a path; or several sources,
            mixed by weight: a list of URLs and :class:`~asyncloader.Source` (docs:
            data.md).  Ignored when ``store`` is given.
        batch_size: Samples per batch.
        transform: Geometry (default ``RandomResizedCrop(224)``); with ``decode=`` None.
        shuffle: ``True``/``"global"``: a new seeded permutation of the whole dataset each
            epoch; ``"node"``: node-local — each node keeps a stable 1/nodes of the data
            across epochs (so its SSD cache holds only that) and shuffles inside it;
            ``False``: listing order.
        seed: Seed of the order and the augmentations.
        labels: ``"folder"`` (ImageFolder), a manifest — a local path, a key beside the
            images, or a URL (``s3://bucket/train.npz``) — of ``.jsonl``/``.csv`` rows or
            ``.npz`` arrays (``ls --write-manifest``), a column of the root's
            ``metadata.jsonl``/``.csv`` (``"label"``), a callable ``key -> int`` or None.
        extras: What each sample carries besides its label: columns of the root's
            ``metadata.jsonl``/``.csv`` (Hugging Face's imagefolder convention), same-stem
            sidecar files by suffix (``"txt"``: ``x.txt`` beside ``x.jpg``; ``"json"``
            parsed; missing: None), ``"source"``.  Batches are then ``(images, labels,
            extras)``, ``extras`` a dict of lists in batch order (docs: data.md).
        extensions: Keys to keep (ignored with a manifest); None keeps every object.
        decode: A hook ``bytes -> uint8 array of sample_shape`` for other blob types.
        sample_shape: (C, H, W) of a sample; needed with ``decode=``.  Images get theirs
            from ``transform`` (3 × its output size); a different one is an error.
        decode_workers: Decode threads/processes (default: the CPUs this process may use —
            affinity or container quota — per rank of its node, less one for the training
            step from 3 a rank, per DataLoader worker; ``repr`` and ``stats()`` say whence).
        decode_backend: ``"thread"``, ``"process"`` or ``"auto"`` (default): threads,
            except with a ``cache_dir`` where JPEGs would be decoded by Pillow (the
            ``_jpegroi``/``_resize`` extensions not built) or by a ``decode=`` hook:
            processes; inside a DataLoader worker, and off POSIX systems, always threads
            (the one rule, ``_decode/_backend.py``, which ``asyncloader bench`` also asks).
            ``"cuda"``: JPEGs are decoded on the GPU of ``device=`` (nvJPEG through
            torchvision, batched), cropped and resized there by the same plan, and land in
            a ring on the device; ``decode_workers`` threads read, plan and decode on the
            CPU what nvJPEG is not given (``_decode/_gpu.py``).  Needs ``device="cuda"``.
        max_inflight: Requests in flight (overrides ``fetch.max_inflight``; default 64 per
            decode worker, at least 64: hides 50 ms of storage latency at the decode rate).
        on_error: ``"raise"`` or ``"skip"`` (counted in ``stats().skipped``).
        max_failures: Skips tolerated per epoch: a count, or a fraction if < 1.
        drop_last: Drop the short last batch of each epoch.
        samples_per_epoch: Samples an epoch (default: all), shared by the sources' weights.
        rank, world_size: This process's shard (default: the whole dataset).
        cache_dir: A local (NVMe) folder caching object bytes across epochs and runs; shared
            safely by every process on the node (see ``asyncloader warm``); kept as
            ``cache=`` says.
        device: Where batches are delivered: ``None`` (default) gives uint8 CPU tensors that
            are views of the ring; ``"cuda"`` (this process's GPU: ``LOCAL_RANK`` under
            torchrun), ``"cuda:1"`` or ``"cpu"`` give ``dtype`` tensors normalised as
            ``output=`` says, made by an uploader thread two batches ahead (on a GPU: copied
            on its own CUDA stream, converted there, the training stream waiting on an event).
            Without CUDA, ``"cuda"`` falls back to the CPU with a warning.
        dtype: ``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"uint8"`` (no normalisation).
        timeout: Give up when no batch arrives for this long (None: wait) [seconds].
        store: An :class:`~asyncloader.ObjectStore` to use instead of ``url``.
        store_options: Keyword options for the store (``endpoint_url``, ``anonymous``, ...).
        objects: The URL's object list, listed already (by the training process for its
            DataLoader workers, by rank 0 for every rank: see ``asyncloader.torch``): the
            store is not listed.
        fetch: Retry, range, hedging and in-flight settings
            (:class:`~asyncloader.FetchConfig`).
        cache: The cache's size, scaled JPEG copies, saved listings and folder permissions
            (:class:`~asyncloader.CacheConfig`).
        shard: Ranks per node, DataLoader workers, equal counts per rank
            (:class:`~asyncloader.ShardConfig`).
        output: Normalisation, layout and pinning of ``device=`` batches
            (:class:`~asyncloader.OutputConfig`).
        engine: Where the engine runs (engine processes, or ``mode="inline"``), ring
            slots, the decompression-bomb limit, the event loop
            (:class:`~asyncloader.EngineConfig`).
        **moved: The keywords that moved into those configs (``cache_size``,
            ``cache_scaled_jpegs``, ``listing_max_age``, ``refresh_listing``,
            ``local_world_size``, ``worker``, ``num_workers``, ``even``, ``mean``, ``std``,
            ``channels_last``, ``pin``, ``prefetch_batches``, ``max_pixels``,
            ``event_loop``) still work for a release, each with a ``DeprecationWarning``
            that names its new spelling.

    Raises:
        ImportError: ``EngineConfig(event_loop="uvloop")`` without uvloop installed.
        TypeError: a keyword the loader does not have.
    """

    def __init__(
        self,
        url: str | Source | Sequence[str | Source] = "",
        *,
        batch_size: int = 256,
        transform: Transform | None = None,
        shuffle: bool | Literal["global", "node"] = True,
        seed: int = 0,
        labels: LabelSpec = "folder",
        extras: Sequence[str] = (),
        extensions: Sequence[str] | None = IMAGE_EXTENSIONS,
        decode: DecodeFn | None = None,
        sample_shape: tuple[int, int, int] | None = None,
        decode_workers: int | None = None,
        decode_backend: DecodeBackend = "auto",
        max_inflight: int | None = None,
        on_error: OnError = "raise",
        max_failures: int | float = 0.01,
        drop_last: bool = False,
        samples_per_epoch: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        cache_dir: str | os.PathLike[str] | None = None,
        device: str | None = None,
        dtype: str = "float32",
        timeout: float | None = None,
        store: ObjectStore | None = None,
        store_options: dict[str, Any] | None = None,
        objects: Sequence[ObjectInfo] | None = None,
        fetch: FetchConfig | None = None,
        cache: CacheConfig | None = None,
        shard: ShardConfig | None = None,
        output: OutputConfig | None = None,
        engine: EngineConfig | None = None,
        **moved: Any,
    ) -> None:
        given = {"cache": cache, "shard": shard, "output": output, "engine": engine}
        configs = fold_moved("ImageLoader", moved, given)
        cache_config: CacheConfig = configs["cache"]
        sh: ShardConfig = configs["shard"]
        out: OutputConfig = configs["output"]
        eng: EngineConfig = configs["engine"]
        run = RunConfig(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            local_world_size=sh.local_world_size,
            worker=sh.worker,
            num_workers=sh.num_workers,
            even=sh.even,
            on_error=on_error,
            max_failures=max_failures,
            extras=tuple(extras),
            samples_per_epoch=samples_per_epoch,
        )
        self.cache = open_cache(cache_dir, cache_config)
        self._plan = p = plan(
            run=run,
            transform=transform,
            decode=decode,
            sample_shape=sample_shape,
            workers=decode_workers,
            backend=decode_backend,
            max_inflight=max_inflight,
            fetch=fetch,
            cache=cache_config,
            engine=eng,
            object_cache=self.cache,
            device=device,
        )
        self._fetch_config = p.fetch
        self._run_config = run
        self._workers = p.workers
        self._cpu_budget = "" if decode_workers else p.budget.describe()  # whence, if not given
        self._backend: DecodeBackend = p.backend
        self._timeout = timeout
        self._counters = Counters()  # the consumer's, and the inline engine's
        self._position = Position()
        self.url = one = store.url if store is not None else url if isinstance(url, str) else ""
        self._consumer: Consumer | None = None
        self._uploader: Uploader | None = None
        self._agreement: Agreement | None = None
        self._unchecked: Sequence[ObjectInfo] | None = None  # the list the ranks agree on
        if device is not None:
            from .._device._device_spec import DeviceSpec
            from .._device._upload import Uploader

            spec = DeviceSpec.make(device, dtype, out.mean, out.std, out.channels_last)
            self._uploader = Uploader(spec, depth=2, pin=out.pin)
        processes, why = engine_placement(p, store_given=store is not None)
        self._engine: Engine = cast(Engine, NoEngine())
        self._finalizer = weakref.finalize(self, close_engine, self._engine)
        try:
            the_store, options, sources = open_the_store(url, store, labels, store_options, run)
            self.url = the_store.url  # canonical: account, bucket, trailing slash
            # Sharded under torch.distributed: one listing per job, every rank checks it (_dist).
            self._agreement = agreement = Agreement.open(one or self.url, labels, rank, world_size)
            if agreement is not None:
                agreement.announce()
            if agreement is not None and objects is None and store is None:
                objects = list_each_once(
                    one,
                    sources,
                    the_store,
                    labels,
                    store_options,
                    folder=self.cache.directory if self.cache is not None else None,
                    max_age=cache_config.max_age,
                    job=agreement.store,
                )
            self._unchecked = objects if agreement is not None else None  # the ranks check it
            engine_spec = EngineSpec(
                plan=p,
                url=self.url,
                store_options=options,
                labels=labels,
                extensions=extensions,
                objects=objects,
                cache=self.cache,
                # A sharded run checks the whole list before its first batch: no streaming.
                stream=run.shuffle is False and agreement is None,
                sources=sources,
            )
            del objects

            def listed(objects: Sequence[ObjectInfo]) -> None:
                if agreement is not None and self._consumer is not None:
                    self._consumer.unchecked = objects

            start_engine(
                engine_spec,
                the_store,
                processes,
                why,
                counters=self._counters,
                adopt=self._set_engine,
                listed=listed,
                device=self._uploader.spec.device if self._uploader is not None else None,
            )
            if self._uploader is not None:
                self._engine.set_uploader(self._uploader)
        except BaseException:
            self.close()
            raise

    def _set_engine(self, engine: Engine) -> None:
        self._engine = engine
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, close_engine, engine)
        self._position.reset()
        self._consumer = Consumer(
            engine,
            self._counters,
            url=self.url,
            timeout=self._timeout,
            max_inflight=self._fetch_config.inflight,
            cpu_budget=self._cpu_budget,
            agreement=self._agreement,
            unchecked=self._unchecked,
            extras=bool(self._run_config.extras),
        )
        self._unchecked = None

    # --- public surface -----------------------------------------------------------------

    @property
    def dataset(self) -> Dataset:
        """All samples and class names (waits for the listing of an unshuffled run)."""
        self._check_open()
        return self._engine.dataset()

    @property
    def decode_backend(self) -> DecodeBackend:
        """``"thread"``, ``"process"`` or ``"cuda"``: what ``decode_backend`` (``"auto"``)
        chose, or was given."""
        return self._backend

    @property
    def engine_processes(self) -> int:
        """Engine processes fetching and decoding for this loader; 0 when its engine runs
        in this process (``EngineConfig(mode="inline")``, or where processes cannot run)."""
        return getattr(self._engine, "processes", 0)

    @property
    def device(self) -> torch.device:
        """Where batches arrive: ``device=`` resolved (``"cuda"`` → this process's GPU,
        or the CPU where CUDA is not available); the CPU without ``device=``."""
        import torch

        return self._uploader.spec.device if self._uploader is not None else torch.device("cpu")

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names, index = label (ImageFolder or a manifest with text labels)."""
        return self.dataset.classes

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch (waits for the listing of an unshuffled run)."""
        self._check_open()
        return self._engine.epoch_samples()

    def __len__(self) -> int:
        """Batches per epoch."""
        r = self._run_config
        return num_batches(self.num_samples, r.batch_size, r.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration runs (its order and augmentations).

        Without it, each iteration runs the epoch after the last one (starting at 0), and
        that next epoch is already being prefetched.
        """
        self._position.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self._position.epoch

    def stats(self) -> Stats:
        """A snapshot of every counter, and which stage bounds the run."""
        if self._consumer is None:
            raise ClosedError("the loader is closed")
        return self._consumer.stats()

    def __iter__(self) -> Iterator[Batch]:
        self._check_open()
        assert self._consumer is not None
        epoch, first, span = self._position.begin()
        batches = self._consumer.batches(epoch, first, span)
        if self._uploader is not None:
            batches = self._uploader.run(batches)
        return self._consumer.deliver(epoch, batches, self._position)

    def state_dict(self) -> dict[str, Any]:
        """Where the run stands: resuming from it continues with the next unseen batch.

        Save it after a training step; the batch just yielded counts as consumed.  Besides
        the epoch and batch, it holds how much of the epoch's order all ranks together have
        consumed (``consumed`` of ``end``; they move in step, so one rank's state tells),
        which lets a run on another world size finish the epoch (version 2).
        """
        return self._position.state(self._run_config, len(self.dataset.samples), self.dataset.mix)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration starts at its next batch.

        Any rank's state serves every rank.  Saved with another world size or worker count
        (by a loader that was a rank's only one), the rest of the epoch's order is dealt
        among this layout's ranks and workers: every sample not yet seen once, equal batch
        counts per rank, later epochs as in an uninterrupted run.

        Raises:
            ValueError: the state belongs to a different dataset, seed, order or batch size
                (resuming would repeat or skip samples); or to another layout with a
                node-local shuffle, or of one of several DataLoader workers (merge the
                rank's worker states first: :func:`merge_worker_states`).
        """
        self._position.load(state, self.state_dict())

    def _check_open(self) -> None:
        if self._engine.closed:
            raise ClosedError("the loader is closed")

    def close(self) -> None:
        """Stop the pipeline, decode workers and loop thread; unlink shared memory.

        Idempotent.  Batches already handed out stay readable; the shared memory behind
        them is freed with the last of them.
        """
        close_engine(self._engine)

    def __enter__(self) -> ImageLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._engine.closed else "open"
        return (
            f"ImageLoader({self.url!r}, batch_size={self._run_config.batch_size}, "
            f"decode_workers={self._workers}"
            + (f" (of {self._cpu_budget})" if self._cpu_budget else "")
            + f", backend={self._backend!r}, "
            f"engine_processes={self.engine_processes}, {state})"
        )
