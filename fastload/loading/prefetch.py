"""Downloading a remote dataset's shards ahead of use, in the order one rank will read them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from fastload.storage.dataset import ShardedDataset

SHARDS_AHEAD = 2  # shards fetched beyond the one being read: downloads overlap decoding


def shards_in_use_order(dataset: ShardedDataset, shards_by_step: Iterable[np.ndarray]) -> Iterator[tuple[int, int]]:
    """(shard, step where it is first used) for each shard that downloads, in order of first use:
    ``shards_by_step`` are the shards each step (a batch; best-fit's token rows: a window) reads, in
    reading order, computed step by step as it is read, so nothing is done for steps far ahead."""
    seen: set[int] = set()
    for step, shards_read in enumerate(shards_by_step):
        shards, first = np.unique(shards_read, return_index=True)
        for shard in shards[np.argsort(first)].tolist():
            if shard not in seen:
                seen.add(shard)
                if dataset.is_remote(shard):
                    yield shard, step


class ShardPrefetcher:
    """A daemon thread fetching shard i (of ``uses``: shards and the step that first uses each, in
    order) into the cache once the step that first uses shard ``i - SHARDS_AHEAD`` has been
    dispatched (``progress()`` = steps dispatched so far). Workers that get ahead of it fetch on
    demand; the cache's lock makes either download once."""

    def __init__(self, dataset: ShardedDataset, uses: Iterator[tuple[int, int]], progress: Callable[[], int]) -> None:
        self.dataset, self.uses, self.progress = dataset, uses, progress
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastload-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._fetch_ahead()
        except BaseException as exc:  # handed to the main thread by check()
            self.error = exc

    def _fetch_ahead(self) -> None:
        first_batch: list[int] = []
        for i, (shard, first_use) in enumerate(self.uses):
            first_batch.append(first_use)
            gate = first_batch[i - SHARDS_AHEAD] if i >= SHARDS_AHEAD else 0
            while self.progress() < gate:
                if self._stop.wait(0.02):
                    return
            if self._stop.is_set():
                return
            self.dataset.fetch(shard)

    def check(self) -> None:
        """Re-raise, in the caller's thread, a download that failed for good."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop fetching (the epoch ended or was abandoned)."""
        self._stop.set()
        self._thread.join(timeout=60)
