"""Downloading a remote dataset's shards ahead of use, in the order one rank will read them."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from fastload.dataset import ShardedDataset

SHARDS_AHEAD = 2  # shards fetched beyond the one being read: downloads overlap decoding


def shards_in_use_order(dataset: ShardedDataset, samples_by_batch: list[np.ndarray]) -> tuple[list[int], list[int]]:
    """(shards in order of first use, the batch number where each is first used)."""
    if not samples_by_batch:
        return [], []
    shard_ids = dataset.shards_of(np.concatenate(samples_by_batch))
    shards, first = np.unique(shard_ids, return_index=True)
    by_first_use = np.argsort(first)
    batch_of_position = np.repeat(np.arange(len(samples_by_batch)), [len(b) for b in samples_by_batch])
    return shards[by_first_use].tolist(), batch_of_position[first[by_first_use]].tolist()


class ShardPrefetcher:
    """A daemon thread fetching shard i into the cache once the batch that first uses shard
    ``i - SHARDS_AHEAD`` has been dispatched (``progress()`` = batches dispatched so far).
    Workers that get ahead of it fetch on demand; the cache's lock makes either download once."""

    def __init__(self, dataset: ShardedDataset, shards: list[int], first_batch: list[int], progress: Callable[[], int]) -> None:
        self.dataset, self.shards, self.first_batch, self.progress = dataset, shards, first_batch, progress
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastload-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for i, shard in enumerate(self.shards):
            gate = self.first_batch[i - SHARDS_AHEAD] if i >= SHARDS_AHEAD else 0
            while self.progress() < gate:
                if self._stop.wait(0.02):
                    return
            if self._stop.is_set():
                return
            try:
                self.dataset.fetch(shard)
            except BaseException as exc:  # handed to the main thread by check()
                self.error = exc
                return

    def check(self) -> None:
        """Re-raise, in the caller's thread, a download that failed for good."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop fetching (the epoch ended or was abandoned)."""
        self._stop.set()
        self._thread.join(timeout=60)
