"""Threads or processes for the fast path's workers? Decode + transform the same batches with N
threads in one process (the libjpeg-turbo extension releases the GIL) and with N forked
processes (what fastload uses), side by side.

    python benchmarks/bench_threads.py data/photos12k-wds --workers 2 --batches 64
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import fastload
from fastload import transforms as T
from fastload.bench.samples import fill_batch


def run_batches(path: str, batch_numbers: list[int], batch_size: int) -> int:
    ds = fastload.open(path)
    images = np.zeros((batch_size, 3, 224, 224), np.uint8)
    labels = np.zeros(batch_size, np.int64)
    for b in batch_numbers:
        fill_batch(ds, np.arange(b * batch_size, (b + 1) * batch_size) % len(ds), T.train(224), 0, 0, "raise", images, labels)
    return len(batch_numbers) * batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    split = [list(range(w, args.batches, args.workers)) for w in range(args.workers)]
    run_batches(args.shards, [0], args.batch_size)  # warm the page cache
    for _ in range(2):
        start = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            done = sum(pool.map(lambda part: run_batches(args.shards, part, args.batch_size), split))
        threads = done / (time.perf_counter() - start)
        start = time.perf_counter()
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            done = sum(pool.starmap(run_batches, [(args.shards, part, args.batch_size) for part in split]))
        processes = done / (time.perf_counter() - start)
        print(f"{args.workers} threads: {threads:.0f} images/s   {args.workers} processes: {processes:.0f} images/s")


if __name__ == "__main__":
    main()
