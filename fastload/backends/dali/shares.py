"""DALI's share of each batch in the hybrid backend: how many of a batch's first samples DALI
decodes (the CPU workers make the rest), written by the training process ahead of the batches and
read by the DALI feed in its worker processes. A small file-backed shared array, so DALI's forked
and spawned workers see it alike."""

from __future__ import annotations

import os
import tempfile
import time
import weakref

import numpy as np

UNSET = -1
WAIT_LIMIT_S = 120.0  # a share not published by then is a bug in the training process, not slowness


class DaliShares:
    """Per batch of the current epoch, the count of its first samples that DALI decodes."""

    def __init__(self, capacity: int) -> None:
        fd, self.path = tempfile.mkstemp(prefix="fastload-dali-shares-")
        try:
            os.ftruncate(fd, max(1, capacity) * 4)
        finally:
            os.close(fd)
        self.capacity = capacity
        self._array: np.ndarray | None = None
        self._unlink: weakref.finalize | None = weakref.finalize(self, _remove, self.path)  # the training process's copy removes the file
        self.clear()

    def __getstate__(self) -> dict:
        """What a DALI worker gets: the file's path, opened there on first use."""
        return {"path": self.path, "capacity": self.capacity}

    def __setstate__(self, state: dict) -> None:
        self.path, self.capacity = state["path"], state["capacity"]
        self._array, self._unlink = None, None

    def _view(self) -> np.ndarray:
        if self._array is None:
            self._array = np.memmap(self.path, dtype=np.int32, mode="r+", shape=(max(1, self.capacity),))
        return self._array

    def clear(self) -> None:
        """A new epoch: no batch's share is known yet."""
        self._view()[:] = UNSET

    def publish(self, batch_no: int, count: int) -> None:
        """Batch ``batch_no``'s first ``count`` samples go to DALI."""
        self._view()[batch_no] = count

    def published(self, batch_no: int) -> int | None:
        """Batch ``batch_no``'s DALI count, or None while it is not decided yet."""
        count = int(self._view()[batch_no])
        return None if count == UNSET else count

    def wait(self, batch_no: int) -> int:
        """Batch ``batch_no``'s DALI count, waiting for the training process to decide it."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        while (count := self.published(batch_no)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fastload hybrid: DALI's share of batch {batch_no} was never published ({self.path})")
            time.sleep(0.0005)
        return count

    def close(self) -> None:
        """Remove the file (DALI's workers, done with it, keep nothing open that matters)."""
        self._array = None
        if self._unlink is not None:
            self._unlink()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
