"""The batch ring: a fixed number of batch buffers, the loader's bounded prefetch queue.

Memory is ``slots × batch_size × C × H × W`` bytes for the images, allocated once.  With a
process decode pool the buffers live in one POSIX shared-memory segment (named
``asyncloader_<pid>_<n>`` so a leak is easy to spot in /dev/shm) that workers attach to;
with threads they are ordinary memory.  Which slot is free or full is the pipeline's
business, not the ring's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import numpy.typing as npt

__all__ = ["SHM_PREFIX", "BatchRing"]

SHM_PREFIX = "asyncloader_"
_counter = itertools.count()


class BatchRing:
    """``slots`` batch buffers of ``batch_size`` samples of ``sample_shape`` uint8 each.

    Attributes:
        images: uint8 array (slots, batch_size, *sample_shape).
        labels: int64 array (slots, batch_size).
        shm_name: The shared-memory segment's name, or None for private memory.
    """

    def __init__(
        self,
        slots: int,
        batch_size: int,
        sample_shape: tuple[int, ...],
        *,
        shared: bool,
    ) -> None:
        if slots < 2:
            raise ValueError("the ring needs at least 2 slots (one filling, one consumed)")
        self.slots = slots
        self.batch_size = batch_size
        shape = (slots, batch_size, *sample_shape)
        nbytes = int(np.prod(shape))
        self._shm: SharedMemory | None = None
        self.images: npt.NDArray[np.uint8]
        if shared:
            name = f"{SHM_PREFIX}{os.getpid()}_{next(_counter)}"
            self._shm = SharedMemory(name=name, create=True, size=max(nbytes, 1))
            self.images = np.ndarray(shape, np.uint8, buffer=self._shm.buf)
        else:
            self.images = np.empty(shape, np.uint8)
        self.labels = np.zeros((slots, batch_size), np.int64)

    @property
    def shm_name(self) -> str | None:
        return self._shm.name if self._shm else None

    @property
    def nbytes(self) -> int:
        return int(self.images.nbytes + self.labels.nbytes)

    def close(self) -> None:
        """Unlink the shared memory.  Idempotent.

        The name goes at once; the mapping itself stays alive while any array or tensor still
        views it (closing it under a live view would crash the consumer), and is freed with
        the last view.
        """
        shm, self._shm = self._shm, None
        if shm is None:
            return
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
        self.images = np.empty((0,), np.uint8)
        with contextlib.suppress(BufferError):
            shm.close()
