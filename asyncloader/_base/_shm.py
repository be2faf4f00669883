"""Shared memory the loader's processes map: the batch rings, made by the training process
and filled by its engine processes (a leaf).

**On Linux a segment is an anonymous memfd** (``memfd_create``).  It lives in no file
system, so the size of ``/dev/shm`` does not bind it (Docker's default is 64 MB, a batch of
256 images at 224 px is 38 MB); its pages count against the process's memory, and its
container's memory limit, as any memory does.  It has no name, so nothing can be left
behind: the kernel frees it with its last descriptor and mapping, however the processes
that hold it end (SIGKILL included).  A child maps it through the descriptor it inherits
at the same number (:attr:`SegmentRef.fd`, in the child's ``pass_fds``).

**Elsewhere** (macOS) it is a POSIX segment in ``/dev/shm``, named ``asyncloader_<pid>_<n>``
(``pid`` its maker's, so a leak is easy to spot); its maker, the training process, unlinks
it, and its resource tracker does should the maker be killed.  An engine process only maps
the segments it is given: what it leaves behind when killed is nothing but its mappings.

Either way every page is reserved when the segment is made (``posix_fallocate``, where the
OS has it): a segment is sparse until written, and a page that cannot be had when the
writer first touches it kills the writer with SIGBUS, mid-epoch.  Reserved at once, a
segment that does not fit fails where it is made, before the first batch, saying what to do.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import sys
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

from ._errors import AsyncLoaderError

__all__ = [
    "SHM_PREFIX",
    "USE_MEMFD",
    "Segment",
    "SegmentRef",
    "shm_free_bytes",
]

SHM_PREFIX = "asyncloader_"
"""The name of every POSIX segment the package makes: ``asyncloader_<pid>_<n>``."""

USE_MEMFD = hasattr(os, "memfd_create")
"""New segments are memfds (Linux); else POSIX segments in ``/dev/shm``."""

_counter = itertools.count()


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """How another process maps a segment: ``size`` bytes, through the descriptor ``fd`` it
    inherits (a memfd) or by ``name`` in ``/dev/shm``."""

    size: int
    fd: int | None = None
    name: str | None = None

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors a child needs (its ``pass_fds``)."""
        return (self.fd,) if self.fd is not None else ()


class Segment:
    """A mapped segment of shared memory (see the module's docstring).

    Attributes:
        ref: How another process maps it.
        buf: Its bytes.
    """

    def __init__(
        self,
        ref: SegmentRef,
        buf: memoryview,
        *,
        mapping: mmap.mmap | None = None,
        shm: SharedMemory | None = None,
        owner: bool = False,
    ) -> None:
        self.ref = ref
        self.buf = buf
        self._mapping = mapping
        self._shm = shm
        self._owner = owner
        self._closed = False

    @classmethod
    def new(cls, size: int, what: str) -> Segment:
        """A new segment of ``size`` bytes, every page reserved.  ``what`` names it in the
        error; a POSIX segment is registered with this process's resource tracker.

        Raises:
            AsyncLoaderError: no room for it (``/dev/shm`` too small, or no memory).
        """
        size = max(size, 1)
        if USE_MEMFD:
            fd = os.memfd_create("asyncloader", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                _reserve(fd, size, what, memfd=True)
                mapping = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                raise
            return cls(SegmentRef(size, fd=fd), memoryview(mapping), mapping=mapping, owner=True)
        name = f"{SHM_PREFIX}{os.getpid()}_{next(_counter)}"
        shm = SharedMemory(name=name, create=True, size=size)
        assert shm.buf is not None
        made = cls(SegmentRef(size, name=name), shm.buf, shm=shm, owner=True)
        try:
            _reserve(shm._fd, size, what, memfd=False)  # type: ignore[attr-defined]
        except BaseException:
            made.close()
            raise
        return made

    @classmethod
    def attach(cls, ref: SegmentRef) -> Segment:
        """Map the segment ``ref`` names (another process's; its maker frees it).  A memfd
        keeps its descriptor open here too, closed with it."""
        if ref.fd is not None:
            mapping = mmap.mmap(ref.fd, ref.size)
            return cls(ref, memoryview(mapping), mapping=mapping)
        assert ref.name is not None
        shm = _untracked(ref.name)  # its maker unlinks it; no tracker of ours may
        assert shm.buf is not None
        return cls(ref, shm.buf, shm=shm)

    def close(self) -> None:
        """Unmap it (and close its descriptor); its maker unlinks a POSIX segment.
        Idempotent.

        Raises:
            BufferError: views of it are still alive (it stays mapped then; a POSIX
                segment's name is gone all the same).
        """
        if self._closed:
            return
        if self._shm is not None and self._owner:  # the name goes first: mappings stay
            self._owner = False
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
        self.buf.release()
        if self._shm is not None:
            self._shm.close()
        else:
            assert self._mapping is not None
            self._mapping.close()
            if self.ref.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self.ref.fd)
        self._closed = True


def _reserve(fd: int, size: int, what: str, *, memfd: bool) -> None:
    """Back every page of the segment ``fd`` now (see the module's docstring)."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # macOS: pages come as they are written
        return
    try:
        fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            return  # a file system that cannot reserve: pages come as they are written
        if memfd:
            raise AsyncLoaderError(
                f"{what} needs {size / 1e6:.0f} MB of memory and there is no room for it "
                "(a container's memory limit?). Make the rings smaller: a smaller "
                "batch_size, or EngineConfig(prefetch_batches=) (ring slots)"
            ) from exc
        free = shm_free_bytes()
        raise AsyncLoaderError(
            f"{what} needs {size / 1e6:.0f} MB of shared memory and /dev/shm has "
            f"{free / 1e6:.0f} MB free. Give it more: docker run --shm-size=2g (or "
            "--ipc=host); on Kubernetes, an emptyDir volume with medium: Memory mounted at "
            "/dev/shm. Or make the rings smaller: a smaller batch_size, or "
            "EngineConfig(prefetch_batches=) (ring slots)"
        ) from exc


def shm_free_bytes() -> int:
    """Bytes free in ``/dev/shm`` (0 where it cannot be read)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _untracked(name: str) -> SharedMemory:
    """The POSIX segment ``name`` attached, not registered with a resource tracker of this
    process (Python < 3.13 registers every attach, and a tracker of this process's own
    would unlink the segment when this process exits)."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)  # type: ignore[call-arg,unused-ignore]
    from multiprocessing import resource_tracker

    register = resource_tracker.register
    resource_tracker.register = lambda *args: None  # type: ignore[assignment]
    try:
        return SharedMemory(name=name)
    finally:
        resource_tracker.register = register
