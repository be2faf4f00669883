"""Worker splitting, exact mid-epoch resume of the plain loader, and elastic resume on
another world size."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import asyncloader as al
from asyncloader._run._resume import epoch_start
from asyncloader.testing import S3TestServer

from .conftest import N_IMAGES, stacks_if_hung


def _index(server: S3TestServer) -> dict[str, int]:
    keys = sorted(k for k in server.stats()["keys"] if k.endswith(".jpg"))
    return {k[len("train/") :]: i for i, k in enumerate(keys)}


def _loader(server: S3TestServer, **kw: object) -> al.ImageLoader:
    """A loader of the light server's folder, each sample labelled by its index; its engine
    inline unless ``engine=`` says otherwise: resume is the trainer's arithmetic (the
    position, the start it gives the engines), the same in either mode, and the tests that
    cross the process boundary say so (engine processes start in ~1 s each on 2 cores)."""
    kw.setdefault("engine", al.EngineConfig(mode="inline"))
    index = _index(server)
    kw.setdefault("batch_size", 8)
    kw.setdefault("decode", al.DecodeConfig(workers=1))
    kw.setdefault("seed", 11)
    return al.ImageLoader(
        "s3://b/train/",
        labels=index.__getitem__,
        **kw,
        store=al.StoreConfig(options={"endpoint_url": server.endpoint}),  # type: ignore[arg-type]
    )


def _batches(loader: al.ImageLoader, epoch: int) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [lab.tolist() for _, lab in loader]


def _dataset(server: S3TestServer) -> Any:
    """An ImageDataset of the light server's folder, labelled as :func:`_loader`'s samples
    (the key's index), with :func:`_loader`'s batch size, seed and decode workers."""
    from .test_torch import _dataset as keyed

    return keyed(server, seed=11, decode=al.DecodeConfig(workers=1))


@pytest.mark.parametrize("world_size", [1, 2])
def test_workers_split_a_rank_round_robin(light_server: S3TestServer, world_size: int) -> None:
    for rank in range(world_size):
        with _loader(light_server, rank=rank, world_size=world_size) as whole:
            expected = _batches(whole, 3)
        parts = []
        for w in range(3):
            with _loader(
                light_server,
                rank=rank,
                world_size=world_size,
                shard=al.ShardConfig(worker=w, num_workers=3),
            ) as part:
                parts.append(_batches(part, 3))
        # A DataLoader takes one batch from each worker in turn: that is the rank's order.
        interleaved = [b for i in range(len(expected)) for b in [parts[i % 3][i // 3]]]
        assert interleaved == expected
        assert sum(len(b) for b in expected) == -(-N_IMAGES // world_size)


RESUME = textwrap.dedent(
    """
    import json, sys, asyncloader as al
    if __name__ == "__main__":
        endpoint, state_file, index_file = sys.argv[1:4]
        index = json.load(open(index_file))
        with al.ImageLoader("s3://b/train/", batch_size=8, seed=11,
                            decode=al.DecodeConfig(workers=1), labels=index.__getitem__,
                            store=al.StoreConfig(options={"endpoint_url": endpoint})) as loader:
            loader.load_state_dict(json.load(open(state_file)))
            loader.set_epoch(loader.state_dict()["epoch"])
            print(json.dumps([lab.tolist() for _, lab in loader]))
    """
)


def test_resume_mid_epoch_in_a_new_process(light_server: S3TestServer, tmp_path: Path) -> None:
    processes = al.EngineConfig()  # the default: engine processes
    with _loader(light_server, engine=processes) as loader:
        full = _batches(loader, 2)
    with _loader(light_server, engine=processes) as loader:
        loader.set_epoch(2)
        seen = []
        for i, (_, lab) in enumerate(loader):
            seen.append(lab.tolist())
            if i == 4:
                state = loader.state_dict()
                break
    assert state["epoch"] == 2
    assert state["next_batch"] == 5
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "index.json").write_text(json.dumps(_index(light_server)))
    (tmp_path / "resume.py").write_text(RESUME)
    out = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "resume.py"),
            light_server.endpoint,
            str(tmp_path / "state.json"),
            str(tmp_path / "index.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rest = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen + rest == full  # the same batches, in order: nothing repeated, nothing lost
    flat = [x for b in seen + rest for x in b]
    assert sorted(flat) == list(range(N_IMAGES))


def _interrupted(
    server: S3TestServer, world: int, k: int, **kw: object
) -> tuple[list[int], dict[str, object]]:
    """Every rank of a ``world``-rank run takes ``k`` batches of epoch 0: the samples they
    consumed together, and rank 0's state (what a checkpoint holds)."""
    consumed: list[int] = []
    saved: dict[str, object] = {}
    for rank in range(world):
        with _loader(server, rank=rank, world_size=world, **kw) as loader:
            seen, state = _first_batches(loader, k)
        consumed += seen
        if rank == 0:
            saved = json.loads(json.dumps(state))
    return consumed, saved


def _first_batches(loader: al.ImageLoader, k: int) -> tuple[list[int], dict[str, object]]:
    """The samples of a rank's first ``k`` batches of epoch 0, and its state then."""
    loader.set_epoch(0)
    it = iter(loader)
    seen = [x for _ in range(k) for x in next(it)[1].tolist()]
    return seen, loader.state_dict()


@pytest.mark.parametrize(
    ("old", "new", "k", "shuffle", "even", "mode"),
    [
        (2, 3, 3, True, "pad", "process"),  # 48 consumed, 48 left: 16 per new rank
        (3, 2, 2, True, "pad", "inline"),
        (2, 3, 2, True, "pad", "inline"),  # 64 left for 3 ranks: two repeats make them even
        (4, 1, 1, False, "pad", "inline"),
        (2, 3, 2, True, "drop", "inline"),  # 64 left: 63 dealt, one left out, as an even world does
    ],
)
def test_elastic_resume_on_another_world_size(
    light_server: S3TestServer, old: int, new: int, k: int, shuffle: bool, even: str, mode: str
) -> None:
    """Rank 0's state after ``k`` batches of an ``old``-rank run, loaded by every rank of
    a ``new``-rank run: together they finish the epoch with every sample not yet seen,
    equal batch counts per rank, and the next epoch is that of an uninterrupted run.  The
    arithmetic is the trainer's (the position, the span it starts the engines on): one case
    runs engine processes, which get that start across the process boundary, the others
    run inline engines, which get the same start on a thread."""
    shard = al.ShardConfig(even=even)  # type: ignore[arg-type]
    kw: dict[str, object] = {"shuffle": shuffle, "shard": shard}
    kw["engine"] = al.EngineConfig(mode=mode)  # type: ignore[arg-type]
    consumed, saved = _interrupted(light_server, old, k, **kw)
    assert saved["consumed"] == len(consumed) == k * 8 * old
    assert len(set(consumed)) == len(consumed)
    rest: list[list[int]] = []
    for rank in range(new):
        with _loader(light_server, rank=rank, world_size=new, **kw) as loader:
            loader.load_state_dict(saved)
            rest.append([x for _, lab in loader for x in lab.tolist()])
            after = loader.state_dict()
            with _loader(light_server, rank=rank, world_size=new, **kw) as fresh:
                assert _batches(loader, 1) == _batches(fresh, 1)
        assert after["epoch"] == 1 and after["next_batch"] == 0
    assert len({len(r) for r in rest}) == 1  # the same count on every rank
    delivered = [x for r in rest for x in r]
    left = set(range(N_IMAGES)) - set(consumed)
    if even == "pad":
        assert set(delivered) == left  # every sample not yet seen, and nothing seen again
        assert len(delivered) - len(left) < new  # repeats only to even out the last round
    else:
        assert len(delivered) == len(set(delivered)) == len(left) - len(left) % new
        assert set(delivered) <= left


def test_elastic_resume_twice(light_server: S3TestServer) -> None:
    """2 ranks → 3 ranks → 1 rank within one epoch: still every sample once."""
    consumed, saved = _interrupted(light_server, 2, 1)
    again: dict[str, object] = {}
    for rank in range(3):
        with _loader(light_server, rank=rank, world_size=3) as loader:
            loader.load_state_dict(saved)
            it = iter(loader)
            consumed += next(it)[1].tolist()
            if rank == 0:
                again = loader.state_dict()
    assert again["start"] == 16 and again["consumed"] == 16 + 3 * 8
    with _loader(light_server) as loader:
        loader.load_state_dict(again)
        consumed += [x for _, lab in loader for x in lab.tolist()]
    assert sorted(consumed) == list(range(N_IMAGES))


def test_elastic_resume_onto_dataloader_workers(light_server: S3TestServer) -> None:
    """A 2-rank state resumed by one rank split among 2 DataLoader workers' loaders."""
    consumed, saved = _interrupted(light_server, 2, 2)
    for worker in range(2):
        with _loader(light_server, shard=al.ShardConfig(worker=worker, num_workers=2)) as loader:
            loader.load_state_dict(saved)
            consumed += [x for _, lab in loader for x in lab.tolist()]
    assert sorted(consumed) == list(range(N_IMAGES))


def test_elastic_resume_refusals(light_server: S3TestServer) -> None:
    with _loader(
        light_server, world_size=2, shuffle="node", shard=al.ShardConfig(local_world_size=1)
    ) as loader:
        state = loader.state_dict()
    with _loader(light_server, shuffle="node") as loader, pytest.raises(ValueError, match="node"):
        loader.load_state_dict(state)
    with _loader(light_server, shard=al.ShardConfig(worker=0, num_workers=2)) as loader:
        state = loader.state_dict()
    with _loader(light_server, world_size=2) as loader, pytest.raises(ValueError, match="worker"):
        loader.load_state_dict(state)
    with _loader(light_server, world_size=2) as loader:
        state = loader.state_dict()
    with _loader(light_server, seed=12) as loader, pytest.raises(ValueError, match="seed"):
        loader.load_state_dict(state)


def test_too_many_workers_for_the_batches_is_refused(light_server: S3TestServer) -> None:
    with pytest.raises(ValueError, match="fewer than the 20 worker"):
        _loader(light_server, batch_size=32, shard=al.ShardConfig(worker=0, num_workers=20))


@pytest.mark.parametrize("new_workers", [2, 3, 1, 0])
# Three workers on a 2-core machine: DataLoader's advice on speed, not an error.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_stateful_dataloader_resumes_mid_epoch(
    light_server: S3TestServer, new_workers: int
) -> None:
    """torchdata's StatefulDataLoader with two workers: stop mid-epoch, save its state, and a
    new DataLoader (new worker processes) finishes the epoch with no sample twice or missed:
    with the same worker count through its own ``load_state_dict``, and with another one
    (or none) through the dataset's, which merges the workers' positions."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from asyncloader.torch import ImageDataset

    def dataset() -> ImageDataset:
        ds = _dataset(light_server)
        ds.set_epoch(2)
        return ds

    def loader(ds: ImageDataset, workers: int) -> Any:
        context = "fork" if workers else None
        return stateful.StatefulDataLoader(
            ds,
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=context,
            worker_init_fn=stacks_if_hung if workers else None,
        )

    first = loader(dataset(), 2)
    seen: list[int] = []
    it = iter(first)
    for _ in range(5):
        seen += next(it)[1].tolist()
    state = first.state_dict()
    del it, first
    ds = dataset()
    if new_workers == 2:
        second = loader(ds, 2)
        second.load_state_dict(state)
    else:
        ds.load_state_dict(state)
        second = loader(ds, new_workers)
    rest = [x for _, labels in second for x in labels.tolist()]
    assert len(seen) == 40
    assert sorted(seen + rest) == list(range(N_IMAGES))


@pytest.mark.slow
def test_the_training_process_state_under_dataloader_workers_is_refused(
    light_server: S3TestServer,
) -> None:
    """A plain DataLoader's workers iterate copies of the dataset: the training process's
    ``state_dict()`` cannot know how far they got, and resuming from ``next_batch: 0`` would
    deliver their batches twice.  It says so (naming StatefulDataLoader) instead; before the
    workers deliver anything, and once the next epoch is set, the state is right again."""
    import torch.utils.data

    from asyncloader.torch import ImageDataset

    ds = ImageDataset(
        "s3://b/train/",
        batch_size=8,
        decode=al.DecodeConfig(workers=1),
        store=al.StoreConfig(options={"endpoint_url": light_server.endpoint}),
    )
    ds.set_epoch(3)
    assert ds.state_dict() == epoch_start(3)
    for context in ("fork", "spawn"):
        dl = torch.utils.data.DataLoader(
            ds, batch_size=None, num_workers=2, multiprocessing_context=context
        )
        it = iter(dl)
        for _ in range(5):
            next(it)
        with pytest.raises(RuntimeError, match="StatefulDataLoader"):
            ds.state_dict()
        del it
        ds.set_epoch(4)  # the next epoch, from its start: nothing delivered of it yet
        assert ds.state_dict() == epoch_start(4)
        ds.set_epoch(3)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_loaded_into_the_dataset_reaches_its_dataloader_workers_once(
    light_server: S3TestServer, persistent: bool
) -> None:
    """``ds.load_state_dict(state)`` then iterating a plain DataLoader: its workers finish
    the state's epoch (every sample once with the batches before it), and the next epoch
    runs whole, as a plain loader runs it — not the state's rest again.  With
    ``persistent_workers=True`` the workers were started (by an earlier epoch) before the
    load, and still take it.  Afterwards the training process's ``state_dict()`` is the
    workers' epoch again (refused: it cannot see how far they got), not the loaded one."""
    import torch.utils.data

    first = _dataset(light_server)
    first.set_epoch(2)
    it = iter(first)
    seen = [x for _ in range(5) for x in next(it)[1].tolist()]
    state = first.state_dict()
    del it
    first.close()
    with _loader(light_server) as plain:  # the same labels: the key's index
        plain.set_epoch(3)
        epoch3 = [labels.tolist() for _, labels in plain]
    ds = _dataset(light_server)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context="fork",
        worker_init_fn=stacks_if_hung,
    )
    if persistent:
        ds.set_epoch(0)
        assert sum(len(labels) for _, labels in dl) == N_IMAGES  # the workers run
    ds.load_state_dict(state)
    assert ds.state_dict() == state
    rest = [x for _, labels in dl for x in labels.tolist()]
    assert len(seen) == 40 and sorted(seen + rest) == list(range(N_IMAGES))
    with pytest.raises(RuntimeError, match="StatefulDataLoader"):
        ds.state_dict()
    ds.set_epoch(3)
    assert [labels.tolist() for _, labels in dl] == epoch3
    ds.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_at_an_epoch_s_last_batch_leaves_nothing_of_it_to_deliver(
    light_server: S3TestServer, workers: int
) -> None:
    """A checkpoint at the end of an epoch: the state taken as the epoch's last batch came
    (its loader has not seen the epoch end).  Loaded into a dataset iterated by a
    DataLoader with workers (another layout: the rest of the epoch is dealt anew) or
    without, the dataset stays in that epoch with nothing of it left: a training loop from
    ``ds.epoch`` gets no batch for it, then each later epoch once, whole — no epoch twice,
    none left out."""
    import torch.utils.data

    first = _dataset(light_server)
    first.set_epoch(2)
    it = iter(first)
    for _ in range(N_IMAGES // 8):
        next(it)
    state = first.state_dict()
    del it
    first.close()
    assert state["epoch"] == 2
    with _loader(light_server) as plain:
        expected = {2: [], **{e: sorted(map(sorted, _batches(plain, e))) for e in (3, 4)}}
    ds = _dataset(light_server)
    ds.load_state_dict(state)
    assert ds.epoch == 2
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        worker_init_fn=stacks_if_hung if workers else None,
    )
    got = {}
    for epoch in range(ds.epoch, ds.epoch + 3):
        ds.set_epoch(epoch)
        got[epoch] = sorted(sorted(labels.tolist()) for _, labels in dl)
    ds.close()
    assert got == expected
