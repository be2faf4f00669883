"""ImageLoader: about 14 everyday options and one config per concern → a plan, its engine
(engine processes of its own, :mod:`._parent`, or a thread of this process, :mod:`._local`),
the sync consumer, resume state.

The consumer (the user's thread) waits for batches in short slices and checks liveness each
time, so end of epoch, a dead engine, a closed loader, a time-out and a consumer that holds
every ring slot are different outcomes, each with its own message.  Where the run stands
(epoch, next batch, span) is kept here, whoever makes the batches.

Lifetime: ``close()`` (or ``with``, or garbage collection, or interpreter exit) closes the
engine: production, the decode threads and the loop stop, and the shared memory goes last
(once no batch handed out references it any more).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, cast

from .._base._buckets import Buckets
from .._base._config import (
    CacheConfig,
    DecodeConfig,
    EngineConfig,
    ErrorConfig,
    FetchConfig,
    OutputConfig,
    RunConfig,
    ShardConfig,
    StoreConfig,
)
from .._base._errors import ClosedError
from .._base._filters import Filters, normalize
from .._base._jobstore import store_address
from .._base._own_thread import run_on_own_thread
from .._base._scalars import Point, scalars
from .._base._sources import Source
from .._base._stats import Counters, Stats
from .._base._types import ObjectInfo, ObjectStore
from .._cache import ObjectCache
from .._dataset._labels import Dataset, LabelSpec
from .._decode._transforms import Transform
from .._run._build import open_the_store, plan
from .._run._dist import Agreement, list_each_once
from .._run._position import Position
from .._run._sampler import num_batches
from ._consumer import Batch, Consumer
from ._start import engine_placement, start_engine
from ._surface import Engine, EngineSpec, NoEngine, close_engine

if TYPE_CHECKING:
    import torch

    from .._device._upload import Uploader

__all__ = ["ImageLoader", "LoaderOptions"]

C = TypeVar("C")


class LoaderOptions(TypedDict, total=False):
    """:class:`ImageLoader`'s keywords but its shard's ``rank`` and ``world_size``, typed:
    what ``asyncloader.torch.ImageDataset`` takes (``**options: Unpack[LoaderOptions]``),
    the rank coming from ``torch.distributed``.  See :class:`ImageLoader` for each."""

    batch_size: int
    transform: Transform | None
    shuffle: bool | Literal["global", "node"]
    seed: int
    labels: LabelSpec
    extras: Sequence[str]
    samples_per_epoch: int | None
    filters: Filters | None
    buckets: Buckets | Sequence[tuple[int, int]] | None
    cache_dir: str | os.PathLike[str] | None
    device: str | None
    dtype: str | None
    timeout: float | None
    decode: DecodeConfig | None
    fetch: FetchConfig | None
    store: StoreConfig | None
    errors: ErrorConfig | None
    cache: CacheConfig | None
    shard: ShardConfig | None
    output: OutputConfig | None
    engine: EngineConfig | None


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

    The everyday options are keywords; everything else is one frozen config per concern
    (decode, fetch, store, errors, cache, shard, output, engine), each field spelled once.

    Args:
        url: ``s3://bucket/prefix/``, ``gs://``, ``az://``, ``https://`` (with a
            manifest), ``file:///path/`` or a path; or several sources, mixed by weight: a
            list of URLs and :class:`~asyncloader.Source` (docs: data.md).  Ignored with
            ``StoreConfig(object_store=)``.
        batch_size: Samples per batch.
        transform: Geometry (default ``RandomResizedCrop(224)``); None with a decode hook.
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
        samples_per_epoch: Samples an epoch (default: all), shared by the sources' weights.
        filters: The samples kept, in pyarrow's form over the columns of the root's
            metadata file and the listing's (``size``, ``file_name``):
            ``[("aesthetic", ">=", 5), ("width", ">=", 512)]`` (AND), a list of such lists
            (OR).  Applied at listing time: a sample left out is never requested, and
            ``stats().filtered_out`` counts it (docs: data.md).
        buckets: Aspect-ratio buckets, ``(height, width)`` sizes or a :class:`Buckets`
            (``asyncloader.make_buckets(1024 * 1024)``: SDXL's set): each image resized to
            cover the bucket nearest its aspect ratio and cropped to it (random or centred,
            seeded), every batch one bucket, ``[B, 3, h, w]``; replaces ``transform``.
            Each sample's size comes from the metadata file's ``width``/``height``, else one
            small range read of its header, kept in ``cache_dir`` for later runs (docs:
            data.md).
        rank, world_size: This process's shard (default: the whole dataset); the rest of
            the shard's layout is ``shard=``.
        cache_dir: A local (NVMe) folder caching object bytes across epochs and runs; shared
            safely by every process on the node (see ``asyncloader warm``); kept as
            ``cache=`` says.
        device: Where batches are delivered: ``None`` (default) gives uint8 CPU tensors that
            are views of the ring; ``"cuda"`` (this process's GPU: ``LOCAL_RANK`` under
            torchrun), ``"cuda:1"`` or ``"cpu"`` give ``dtype`` tensors normalised as
            ``output=`` says, made by an uploader thread two batches ahead (on a GPU: copied
            on its own CUDA stream, converted there, the training stream waiting on an event).
            Without CUDA, ``"cuda"`` falls back to the CPU with a warning.  A ``dtype`` or
            an ``output=`` given without a device are done on the CPU (``"cpu"``), never
            ignored.
        dtype: ``"float32"`` (the default with a device), ``"float16"``, ``"bfloat16"`` or
            ``"uint8"`` (no normalisation).
        timeout: Give up when no batch arrives for this long (None: wait) [seconds].
        decode: Decode threads, the GPU backend, a decode hook for other blob types, the
            decompression-bomb limit (:class:`~asyncloader.DecodeConfig`).
        fetch: Requests in flight, retries, ranges and hedging
            (:class:`~asyncloader.FetchConfig`).
        store: The store's options (``endpoint_url``, credentials' profile, ...), an
            object store to read instead, an object list listed already, the extensions
            kept (:class:`~asyncloader.StoreConfig`).
        errors: ``on_error`` (``"raise"`` or ``"skip"``) and the failures tolerated per
            epoch (:class:`~asyncloader.ErrorConfig`).
        cache: The cache's size, scaled JPEG copies, saved listings and folder permissions
            (:class:`~asyncloader.CacheConfig`).
        shard: Ranks per node, DataLoader workers, equal counts per rank, ``drop_last``
            (:class:`~asyncloader.ShardConfig`).
        output: Normalisation, layout and pinning of ``device=`` batches
            (:class:`~asyncloader.OutputConfig`).
        engine: Where the engine runs (engine processes, or ``mode="inline"``), ring
            slots, the event loop, restarts (:class:`~asyncloader.EngineConfig`).

    Raises:
        ImportError: ``EngineConfig(event_loop="uvloop")`` without uvloop installed.
        TypeError: a config that is not of its kind (a decode hook given as ``decode=``:
            it is ``DecodeConfig(hook=...)``).
        ValueError: options that contradict each other.
        AsyncLoaderError: the store cannot be listed, or holds no samples.
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
        samples_per_epoch: int | None = None,
        filters: Filters | None = None,
        buckets: Buckets | Sequence[tuple[int, int]] | None = None,
        rank: int = 0,
        world_size: int = 1,
        cache_dir: str | os.PathLike[str] | None = None,
        device: str | None = None,
        dtype: str | None = None,
        timeout: float | None = None,
        decode: DecodeConfig | None = None,
        fetch: FetchConfig | None = None,
        store: StoreConfig | None = None,
        errors: ErrorConfig | None = None,
        cache: CacheConfig | None = None,
        shard: ShardConfig | None = None,
        output: OutputConfig | None = None,
        engine: EngineConfig | None = None,
    ) -> None:
        decoding = _config("decode", decode, DecodeConfig)
        layout = _config("shard", shard, ShardConfig).for_shuffle(shuffle)
        where = _config("store", store, StoreConfig)
        cache_config = _config("cache", cache, CacheConfig)
        out = _config("output", output, OutputConfig)
        run = RunConfig(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            shard=layout,
            errors=_config("errors", errors, ErrorConfig),
            extras=tuple(extras),
            samples_per_epoch=samples_per_epoch,
            filters=normalize(filters),
            buckets=Buckets.of(buckets),
            upright=decoding.exif_orientation,
        )
        self.cache = ObjectCache.opened(cache_dir, cache_config)
        self._plan = p = plan(
            run=run,
            transform=transform,
            decode=decoding,
            fetch=_config("fetch", fetch, FetchConfig),
            cache=cache_config,
            engine=_config("engine", engine, EngineConfig),
            object_cache=self.cache,
            device=device,
        )
        self._run_config = run
        # Where the decode worker count came from, in words, where it was not given.
        self._cpu_budget = "" if decoding.workers else p.budget.describe()
        self._timeout = timeout
        self._counters = Counters()  # the consumer's, and the local engine's
        self._position = Position()
        self._marks: dict[str, Point] = {}  # where scalars(since=) counts from
        given = where.object_store
        self.url = one = given.url if given is not None else url if isinstance(url, str) else ""
        self._consumer: Consumer | None = None
        self._uploader: Uploader | None = None
        self._agreement: Agreement | None = None
        self._unchecked: Sequence[ObjectInfo] | None = None  # the list the ranks agree on
        if device is None and (dtype is not None or output is not None):
            device = "cpu"  # a conversion asked for is done, on the CPU: never ignored
        if device is not None:
            from .._device._device_spec import DeviceSpec
            from .._device._upload import Uploader

            spec = DeviceSpec.make(device, dtype or "float32", out.mean, out.std, out.channels_last)
            self._uploader = Uploader(spec, depth=2, pin=out.pin)
        processes, why = engine_placement(p, store_given=given is not None)
        if processes and p.backend == "cuda" and self._uploader is not None:
            # The engines ship each batch's JPEGs; they are decoded here, on this GPU.
            from .._decode._gpu_batch import ShipUnpacker

            self._uploader.unpack = ShipUnpacker(
                p.spec,
                self._uploader.spec.device,
                self._counters,
                skip=run.errors.on_error == "skip",
            )
        self._engine: Engine = cast(Engine, NoEngine())
        self._finalizer = weakref.finalize(self, close_engine, self._engine)
        the_store: ObjectStore | None = None
        try:
            the_store, options, sources = open_the_store(url, where, labels, run)
            self.url = the_store.url  # canonical: account, bucket, trailing slash
            # Sharded under torch.distributed: one listing per job, every rank checks it (_dist).
            self._agreement = agreement = Agreement.open(one or self.url, labels, rank, world_size)
            if agreement is not None:
                agreement.announce()
            objects = where.objects
            if agreement is not None and objects is None and given is None:
                objects = list_each_once(
                    one,
                    sources,
                    the_store,
                    labels,
                    dict(where.options),
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
                extensions=where.extensions,
                objects=objects,
                # A sharded run checks the whole list before its first batch: no streaming.
                stream=run.shuffle is False and agreement is None,
                sources=sources,
                job=store_address(),
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
            self._close_unowned(the_store, given)
            raise
        self._close_unowned(the_store, given)

    def _close_unowned(self, store: ObjectStore | None, given: ObjectStore | None) -> None:
        """Close ``store``, opened here, unless the engine in this process owns it (its
        runtime closes it with the rest): engine processes open stores of their own, so
        this one served its URL (and the job's listing of several sources) only."""
        owned = not self.engine_processes and not isinstance(self._engine, NoEngine)
        if store is not None and store is not given and not owned:
            run_on_own_thread(store.close())

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
            max_inflight=self._plan.fetch.inflight,
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
    def decode_backend(self) -> Literal["thread", "cuda"]:
        """``"thread"`` or ``"cuda"``: where samples are decoded (``DecodeConfig.backend``)."""
        return self._plan.backend

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
        return self._engine.epoch_samples(self._position.epoch)

    def __len__(self) -> int:
        """Batches per epoch."""
        r = self._run_config
        return num_batches(self.num_samples, r.batch_size, r.shard.drop_last)

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

    def scalars(self, since: Literal["call", "epoch", "start"] = "call") -> dict[str, float]:
        """The loader's health as flat scalars (names and meanings:
        :data:`asyncloader.SCALARS`), for a trainer's plots: counts, times and rates of
        the stretch since the last ``scalars()`` call (``"call"``; the first: since the
        start), since the current epoch's iteration began (``"epoch"``) or since the loader
        started (``"start"``); gauges as they stand.  :class:`~asyncloader.LoaderLogger`
        logs them every N steps."""
        if since not in ("call", "epoch", "start"):
            raise ValueError(f"since must be 'call', 'epoch' or 'start', not {since!r}")
        now = Point.of(self.stats())
        earlier = self._marks.get(since) if since != "start" else None
        if since == "call":
            self._marks["call"] = now
        return scalars(now, earlier)

    def health_point(self) -> Point:
        """What the loader has counted now, as a :class:`~asyncloader._base._scalars.Point`
        (what :class:`~asyncloader.LoaderLogger` differences)."""
        return Point.of(self.stats())

    def __iter__(self) -> Iterator[Batch]:
        self._check_open()
        assert self._consumer is not None
        self._marks["epoch"] = Point.of(self.stats())
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
        return self._position.state(
            self._run_config,
            len(self.dataset.samples),
            self.dataset.mix,
            self._engine.epoch_samples,
        )

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
        """Stop the engine: production, decode threads and loop thread, engine processes;
        unlink shared memory.

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
            f"decode_workers={self._plan.workers}"
            + (f" (of {self._cpu_budget})" if self._cpu_budget else "")
            + f", backend={self._plan.backend!r}, "
            f"engine_processes={self.engine_processes}, {state})"
        )


def _config(name: str, value: C | None, kind: type[C]) -> C:
    """``value`` of the loader's ``name=`` config, or the config's defaults (None).

    Raises:
        TypeError: ``value`` is not a ``kind`` (a hook or a store object given where their
            config goes: the message names it).
    """
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    hint = ""
    if name == "decode" and callable(value):
        hint = ": a decode hook is DecodeConfig(hook=..., sample_shape=(C, H, W))"
    elif name == "store":
        hint = ": a store object is StoreConfig(object_store=...)"
    raise TypeError(f"{name}= takes a {kind.__name__}, not {value!r}{hint}")
