"""``fastload index`` against ``cat TARS > /dev/null`` and sha256 alone, over the same tars, side by side.

The tars of a converted dataset are hard-linked into a scratch folder (nothing copied, nothing
rewritten) and indexed there. Each round times, in turn: ``cat``, sha256 of every tar (one
thread per tar), and ``fastload index`` (index_tars with ``--workers`` processes, default one per
CPU, fsyncs included).
``warm``: from the page cache; ``cold``: each tar's pages dropped first (posix_fadvise DONTNEED,
no root needed), so the disk is read. Prints the medians and the rates' ratios.

    python benchmarks/bench_index.py /tmp/photos-wds --rounds 5 [--workers N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastload.converters.index_tars import index_tars


def drop_cache(paths: list[Path]) -> None:
    """Evict the files' pages from the page cache (clean pages only: the tars are never written)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cat(paths: list[Path]) -> None:
    """The baseline the issue names: ``cat TARS > /dev/null``."""
    subprocess.run("cat " + " ".join(f"'{p}'" for p in paths) + " > /dev/null", shell=True, check=True)


def sha256_only(paths: list[Path]) -> None:
    """sha256 of every tar read in 4 MiB blocks, one thread per tar: hashing's own rate."""

    def digest(path: Path) -> str:
        sha = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while block := f.read(1 << 22):
                sha.update(block)
        return sha.hexdigest()

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        list(pool.map(digest, paths))


def timed(run: Callable[[], object], before: Callable[[], None]) -> float:
    before()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path, help="a folder of .tar shards (a converted dataset)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, help="index_tars' processes (default: one per CPU)")
    args = parser.parse_args()
    tars = sorted(args.dataset.glob("*.tar"))
    if not tars:
        raise SystemExit(f"{args.dataset}: no .tar files")
    scratch = Path(tempfile.mkdtemp(prefix="bench-index-", dir=args.dataset.parent))
    try:
        linked = []
        for tar in tars:
            os.link(tar, scratch / tar.name)
            linked.append(scratch / tar.name)
        total = sum(p.stat().st_size for p in linked)
        print(f"{len(linked)} tars, {total / 1e6:.1f} MB, {os.cpu_count()} CPUs, {args.rounds} rounds")
        runs = {"cat": lambda: cat(linked), "sha256": lambda: sha256_only(linked), "index": lambda: index_tars(scratch, force=True, workers=args.workers)}
        for mode, before in (("warm", lambda: cat(linked)), ("cold", lambda: drop_cache(linked))):
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, run in runs.items():
                    times[name].append(timed(run, before))
            median = {name: statistics.median(t) for name, t in times.items()}
            rates = "  ".join(f"{name} {median[name] * 1e3:.0f} ms ({total / median[name] / 1e9:.2f} GB/s)" for name in runs)
            print(f"{mode}: {rates}")
            print(f"{mode}: index / cat rate {median['cat'] / median['index']:.2f}x, "
                  f"index / sha256 rate {median['sha256'] / median['index']:.2f}x, "
                  f"sha256 / cat rate {median['cat'] / median['sha256']:.2f}x")
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
