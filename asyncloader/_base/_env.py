"""What the process's environment says about where it runs (a leaf module): the CPUs it may
use, and its place in a ``torchrun`` job (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``LOCAL_RANK``).  Read here only, so every part of the package agrees."""

from __future__ import annotations

import os

__all__ = [
    "agent_store",
    "local_rank",
    "local_world_size",
    "shard_from_env",
    "usable_cpus",
]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which ``taskset`` and container
    CPU sets narrow), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _int(name: str) -> int | None:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else None
    except ValueError:
        return None


def shard_from_env() -> tuple[int, int]:
    """``(RANK, WORLD_SIZE)`` from the torchrun environment (0 and 1 where unset), or
    ``(0, 1)`` when either is not a number."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def agent_store() -> tuple[str, int, str] | None:
    """``(host, port, key prefix)`` of torchrun's agent store where the environment names
    one (``TORCHELASTIC_USE_AGENT_STORE``, ``MASTER_ADDR``, ``MASTER_PORT``), its prefix
    naming the run and its restart (``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``),
    so that a restarted job starts afresh; else None."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    host, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return None
    run = env.get("TORCHELASTIC_RUN_ID", "none")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return host, int(port), f"asyncloader/{run}/{restart}"


def local_world_size() -> int | None:
    """Ranks per node (``LOCAL_WORLD_SIZE`` under torchrun), or None."""
    return _int("LOCAL_WORLD_SIZE")


def local_rank() -> int | None:
    """This rank's index on its node (``LOCAL_RANK`` under torchrun), or None."""
    return _int("LOCAL_RANK")
