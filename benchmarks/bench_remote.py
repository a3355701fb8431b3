"""Loading from object storage vs local disk, side by side in one run: the same converted dataset
read from its folder and through a loopback HTTP server (cold cache: every shard downloaded
during the epoch; warm cache: the second pass), same loader settings, rounds interleaved.

    python benchmarks/bench_remote.py data/photos-wds --workers 2 --rounds 2
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import fastload
from fastload import transforms as T


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def serve(directory: str) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``directory`` on a free loopback port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=directory))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def images_per_s(dataset: fastload.ShardedDataset, workers: int, batch_size: int) -> float:
    """One epoch of train(224) in the streaming order; images per second from the first request."""
    start = time.perf_counter()
    count = 0
    with fastload.DataLoader(dataset, batch_size=batch_size, shuffle=True, shuffle_buffer=2048,
                             num_workers=workers, transform=T.train(224)) as loader:
        for images, _ in loader:
            count += len(images)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", help="a converted dataset folder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    server = serve(args.dataset)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    rates: dict[str, list[float]] = {"local disk": [], "http, cold cache": [], "http, warm cache": []}
    images_per_s(fastload.open(args.dataset), args.workers, args.batch_size)  # page cache warm for both
    for _ in range(args.rounds):
        rates["local disk"].append(images_per_s(fastload.open(args.dataset), args.workers, args.batch_size))
        cache = tempfile.mkdtemp(prefix="fastload-bench-cache-")
        try:
            rates["http, cold cache"].append(images_per_s(fastload.open(url, cache_dir=cache), args.workers, args.batch_size))
            rates["http, warm cache"].append(images_per_s(fastload.open(url, cache_dir=cache), args.workers, args.batch_size))
        finally:
            shutil.rmtree(cache)
    server.shutdown()
    base = statistics.median(rates["local disk"])
    print(f"{len(fastload.open(args.dataset))} samples, {args.workers} workers, batch {args.batch_size}, train(224), "
          f"median of {args.rounds} rounds")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"  {name:<18} {rate:8.0f} images/s   {rate / base:5.2f}x local")


if __name__ == "__main__":
    main()
