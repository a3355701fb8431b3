"""What ``fastload bench`` measures: a loader's rates and costs over whole epochs, and the decode
ceiling (libjpeg-turbo full decodes per second) it is compared with."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from fastload.fields import JPEG_FIELD
from fastload.storage.dataset import ShardedDataset


def _tree_rss() -> float:
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 1e6


class PeakRss:
    """Samples the process tree's RSS every 250 ms in a thread (shared pages count once per process)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss())
            self._stop.wait(0.25)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _tree_rss())


def _cpu_seconds() -> float:
    """CPU time of this process, its finished children and its live children."""
    import psutil

    own = resource.getrusage(resource.RUSAGE_SELF)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            live += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return own.ru_utime + own.ru_stime + done.ru_utime + done.ru_stime + live


def time_batches(make: Callable[[], Iterable], epochs: int, mean_bytes: float) -> dict[str, float]:
    """Iterate ``epochs`` epochs of a fresh loader (its start-up counts); rates and costs."""
    with PeakRss() as rss:
        cpu0, start = _cpu_seconds(), time.perf_counter()
        loader = make()
        first, first_images, images = None, 0, 0
        for _ in range(epochs):
            for batch in loader:
                images += len(batch[0])
                if first is None:
                    first, first_images = time.perf_counter() - start, images
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu0
        if hasattr(loader, "close"):
            loader.close()
        del loader
    return {
        "images_per_s": images / seconds, "mb_per_s": images * mean_bytes / seconds / 1e6,
        "cpu_s_per_1k": 1000 * cpu / max(images, 1), "peak_rss_mb": rss.peak, "first_batch_s": first or 0.0,
        "running_images_per_s": (images - first_images) / max(seconds - (first or 0.0), 1e-9),
    }


def ceiling_images(ds: ShardedDataset, limit: int = 600) -> list[bytes]:
    """Up to ``limit`` of the dataset's JPEGs, evenly spread: what the decode ceiling is measured on."""
    step = max(1, len(ds) // limit)
    return [fields[JPEG_FIELD] for fields in (ds.raw(i)[1] for i in range(0, len(ds), step)) if JPEG_FIELD in fields]


def decode_rate(images: list[bytes], threads: int = 1, passes: int = 3) -> float:
    """Full libjpeg-turbo decodes per second of ``threads`` threads each decoding every one of
    ``images`` at once (simplejpeg releases the GIL): the fastest of ``passes`` passes, so a pass
    slowed by machine noise doesn't lower the bar."""
    import simplejpeg

    def decode_all(_: int = 0) -> None:
        for data in images:
            simplejpeg.decode_jpeg(data, colorspace="RGB")

    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(passes):
            start = time.perf_counter()
            list(pool.map(decode_all, range(threads)))
            best = min(best, time.perf_counter() - start)
    return threads * len(images) / best


def mean_image_bytes(ds: ShardedDataset) -> float:
    """Average encoded bytes per sample (shard bytes / samples)."""
    return ds.index.total_bytes / max(len(ds), 1)
