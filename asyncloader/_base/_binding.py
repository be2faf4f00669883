"""The CPUs the ranks of a node are bound to, told to each other through a node-local folder
(a leaf): where a launcher binds each rank to CPUs of its own (SLURM's ``--cpu-bind``,
``numactl`` wrappers, torchrun's NUMA binding), a rank's share is its own mask, not the
node's CPUs divided by its ranks a second time.

Each rank of a job writes its affinity mask to ``<tmp>/asyncloader-cpus-<job>/<local
rank>`` (the job named by torchrun's run id and restart count, or SLURM's job and step:
a new job never reads an old one's), then reads the others' (waiting a little, once per
process, for those not written yet).  For each CPU of its
mask it counts the local ranks whose masks hold it, and its share is the sum over its CPUs
of one over that count (:func:`share_of`): masks that do not overlap give each rank its
whole mask, identical masks an even split, anything between what it says.  The node-local
folder needs no process group and no torch, so it works under ``srun`` as under torchrun,
and for every process of a rank (its DataLoader workers read the same files).

A rank's file holds its mask on its first line and the process that wrote it on the second.
A job's folder stays while the job runs (nothing tells a rank that the others are done);
the next job on the node whose first process makes its own folder removes the earlier jobs'
folders of the same user that nobody wrote for :data:`STALE` seconds and whose writers have
all ended (:func:`sweep`), so that job after job does not leave a folder each behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Collection, Mapping
from pathlib import Path

from ._proctree import alive

__all__ = ["Binding", "cpus_said", "job_of_node", "node_masks", "share_of", "sweep"]

WAIT = 1.0
"""How long a process waits for the other local ranks' masks [seconds], once: the ranks make
their loaders at about the same time, and one that comes later finds the others' files
there (a rank's file stays for the job, written by the first of its processes).  A mask not
written by then counts as sharing this rank's whole mask (the split before binding was
known), so a rank never takes more than its due and never waits longer than this; a loader
made by rank 0 alone (validation while the others wait) waits this long once, and splits its
CPUs as if they were shared."""

PREFIX = "asyncloader-cpus-"
"""The start of a job's folder's name in the temporary folder (the job's name follows)."""

STALE = 3600.0
"""How long a job's folder must have gone unwritten [seconds] before a later job may remove
it, its writers all ended: an hour, far beyond the second its ranks wait for each other.  A
writer's process number seen alive (or another process now holding that number) keeps the
folder; one that cannot be read counts as ended, so that a folder from before the writers
were named still goes once it is this old."""

_waited: set[str] = set()  # jobs this process has waited for once


def share_of(mine: Collection[int], masks: Mapping[int, Collection[int]]) -> float:
    """This rank's share of the CPUs of its mask ``mine``, given the masks of every local
    rank (``masks``, this rank's among them): for each of its CPUs, one over the number of
    ranks whose masks hold it, summed.  Disjoint masks: ``len(mine)``; ``n`` identical
    masks: ``len(mine) / n``."""
    share = 0.0
    for cpu in mine:
        holders = sum(1 for mask in masks.values() if cpu in mask)
        share += 1.0 / max(holders, 1)
    return share


class Binding:
    """What this rank's mask shares with the other local ranks' (see the module's
    docstring).

    Args:
        local_rank: This rank's place on the node.
        masks: The masks known, by local rank (this rank's among them).
        ranks: The node's ranks.

    Attributes:
        share: This rank's CPUs [CPUs, a fraction where masks overlap].
        heard: Local ranks whose masks were known (this one's included).
        kind: ``"own"`` (no other rank's mask holds any of its CPUs), ``"shared"`` (every
            local rank has this very mask), ``"overlapping"`` (anything between), or
            ``"unknown"`` (not every local rank's mask could be read: the CPUs are then
            split evenly among the ranks, as before binding was known).
    """

    def __init__(self, local_rank: int, masks: Mapping[int, Collection[int]], ranks: int):
        mine = set(masks[local_rank])
        known = {r: set(m) for r, m in masks.items()}
        self.heard = len(known)
        # Ranks not heard from count as sharing this rank's whole mask, so that a rank never
        # takes more than its due (and the kind says "unknown": an even split is used).
        for r in range(ranks):
            known.setdefault(r, mine)
        self.share = share_of(mine, known)
        others = [m for r, m in known.items() if r != local_rank]
        if self.heard < ranks or ranks <= 1:
            self.kind = "unknown"
        elif not any(m & mine for m in others):
            self.kind = "own"
        elif all(m == mine for m in others):
            self.kind = "shared"
        else:
            self.kind = "overlapping"

    def describe(self, cpus: int, ranks: int, source: str) -> str:
        """Where this rank's share comes from, in a few words (``cpus`` in its mask, of
        ``ranks`` on the node, as ``source`` says)."""
        if self.kind == "own":
            alone = f"{cpus_said(cpus)} bound to this rank alone"
            return f"{alone} ({ranks} ranks on this node, {source})"
        if self.kind == "overlapping":
            return (
                f"{self.share:.1f} of the {cpus_said(cpus)} bound to this rank (the masks of "
                f"the node's {ranks} ranks overlap, {source})"
            )
        return f"{cpus_said(cpus)} shared by {ranks} ranks on this node ({source})"


def cpus_said(n: int) -> str:
    """``"1 CPU"``, ``"12 CPUs"``."""
    return f"{n} CPU" if n == 1 else f"{n} CPUs"


def job_of_node(environ: Mapping[str, str] | None = None) -> str | None:
    """A name of this job on this node that its ranks share, or None where nothing names
    the job (then no rank can know the others' masks)."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torch-{env['TORCHELASTIC_RUN_ID']}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}-{env.get('SLURM_STEP_ID', '0')}"
    return None


def _read(path: Path) -> set[int] | None:
    """A mask as written (CPUs, comma-separated, on the first line), or None where it is not
    there yet."""
    try:
        return {int(c) for c in path.read_text().split("\n", 1)[0].strip().split(",") if c}
    except (OSError, ValueError):
        return None


def _writer(path: str) -> int | None:
    """The process that wrote a rank's file (its second line), or None where it says none."""
    try:
        with open(path) as f:
            return int(f.read().split("\n")[1])
    except (OSError, ValueError, IndexError):
        return None


def sweep(tmp: Path, keep: str, stale: float = STALE) -> list[str]:
    """Remove the job folders in ``tmp`` (all but ``keep``) that are this user's, that no
    process wrote for ``stale`` seconds, and whose writers have all ended; returns their
    names.  Whatever cannot be read is left alone."""
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX) or entry.name == keep:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
                continue
            if now - st.st_mtime < stale:
                continue
            writers = [_writer(f.path) for f in os.scandir(entry.path) if f.name.isdigit()]
        except OSError:
            continue
        if any(pid is not None and alive(pid) for pid in writers):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    return removed


def node_masks(
    job: str, local_rank: int, ranks: int, mine: Collection[int], wait: float = WAIT
) -> dict[int, set[int]]:
    """Publish ``mine`` as local rank ``local_rank``'s mask for ``job`` (unless a process
    of the rank did) and read every local rank's (``ranks`` of them), waiting up to
    ``wait`` seconds for those not written yet, the first time this process asks for
    ``job``.  An unwritable folder leaves this rank's own mask alone in the answer."""
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}{job}"
    path = folder / str(local_rank)
    made = False
    if _read(path) != set(mine):
        with contextlib.suppress(OSError):
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
                made = True
            tmp = folder / f".{local_rank}.{os.getpid()}"
            tmp.write_text(",".join(str(c) for c in sorted(mine)) + f"\n{os.getpid()}\n")
            os.replace(tmp, path)  # whole or not at all: a reader never sees it torn
    if made:  # the job's first process on the node: earlier jobs' folders that are done go
        sweep(folder.parent, folder.name)
    masks: dict[int, set[int]] = {local_rank: set(mine)}
    deadline = time.monotonic() + (wait if job not in _waited else 0.0)
    _waited.add(job)
    while True:
        for r in range(ranks):
            if r not in masks:
                got = _read(folder / str(r))
                if got is not None:
                    masks[r] = got
        if len(masks) >= ranks or time.monotonic() >= deadline:
            return masks
        time.sleep(0.02)
