"""Where the job's key-value store is, and a client of it in this process.

Every process of a ``torchrun`` job — each rank, and each rank's DataLoader workers and
engine processes — can reach the job's store: the TCPStore of torchrun's agent
(``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE``), the same store under
gloo and NCCL, with or without a process group.  Without torchrun, a process group
initialised on a TCPStore serves the same way, its address handed to the processes it starts
(:func:`adopt_store_address`); and a dataset outside any job makes a store of its own for
its DataLoader workers (:func:`own_store`).  What travels through it:
:mod:`asyncloader._run._dist`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ._env import agent_store, in_dataloader_worker
from ._errors import AsyncLoaderError

__all__ = [
    "StoreAddress",
    "adopt_store_address",
    "adopted",
    "job_store",
    "own_store",
    "store_address",
]

log = logging.getLogger("asyncloader")


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """Where the job's store is, picklable (a DataLoader worker connects to it anew)."""

    host: str
    port: int
    prefix: str


_adopted: StoreAddress | None = None
_clients: dict[tuple[int, StoreAddress], Any] = {}


def store_address() -> StoreAddress | None:
    """The job's store: torchrun's agent store, else the default process group's
    TCPStore (in the process that initialised it), else None (a single process, or a
    process group on another kind of store)."""
    agent = agent_store()
    if agent is not None:
        return StoreAddress(*agent)
    if _adopted is not None:
        return _adopted
    if "torch" not in sys.modules:  # no process group without torch imported
        return None
    if in_dataloader_worker():  # its parent's group, not one of its own
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    while isinstance(store, PrefixStore):
        store = store.underlying_store
    if not isinstance(store, TCPStore):
        return None
    return StoreAddress(store.host, store.port, "asyncloader/pg")


def adopt_store_address(address: StoreAddress | None) -> None:
    """Use ``address`` in this process where the environment names no store (a
    DataLoader worker of a process group started without torchrun)."""
    global _adopted
    _adopted = address


@contextlib.contextmanager
def adopted(address: StoreAddress | None) -> Iterator[None]:
    """:func:`adopt_store_address` for the loaders made in the block only."""
    global _adopted
    before, _adopted = _adopted, address if address is not None else _adopted
    try:
        yield
    finally:
        _adopted = before


def own_store() -> tuple[Any, StoreAddress] | None:
    """A store of this process's own on 127.0.0.1, for the processes it starts (a dataset's
    DataLoader workers) where no job names one, so that they too read what is made once
    (the images' sizes) once: the server (it serves while it is referenced) and its
    address, or None where ``torch.distributed`` cannot make one (then each reads its own).
    """
    import torch.distributed as dist

    if not dist.is_available():
        return None
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    try:
        server = TCPStore(
            "127.0.0.1",
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=60),
        )
    except Exception as exc:  # no loopback socket here: each process reads its own
        log.warning("asyncloader: no store for DataLoader workers to share in (%s)", exc)
        return None
    prefix = f"asyncloader/own/{os.getpid()}-{secrets.token_hex(4)}"
    return server, StoreAddress("127.0.0.1", int(server.port), prefix)


def job_store(address: StoreAddress | None = None) -> Any | None:
    """A client of the job's store under this package's prefix (one per process), or None:
    of ``address`` where given, else of :func:`store_address`.

    Raises:
        AsyncLoaderError: the store named by the environment cannot be reached.
    """
    address = address if address is not None else store_address()
    if address is None:
        return None
    key = (os.getpid(), address)
    client = _clients.get(key)
    if client is None:
        from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

        try:
            tcp = TCPStore(
                address.host,
                address.port,
                is_master=False,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=60),
            )
        except Exception as exc:
            raise AsyncLoaderError(
                f"cannot reach the job's store at {address.host}:{address.port} "
                f"(torchrun's MASTER_ADDR/MASTER_PORT): {exc}"
            ) from exc
        client = _clients[key] = PrefixStore(address.prefix, tcp)
    return client
