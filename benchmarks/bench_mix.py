"""A weighted mixture of two photo datasets against one dataset, side by side in one run.

    python benchmarks/bench_mix.py CONVERTED PHOTO_FOLDER WORKDIR [--workers 2] [--rounds 3] [--epochs 1]

CONVERTED is a converted dataset (e.g. data/photos-wds); a second one is converted once from
PHOTO_FOLDER into WORKDIR (other shards, shuffled with another seed). Each round loads, in turn,
the one dataset and ``fastload.mix({CONVERTED: 1, second: 1})`` with as many samples an epoch
(which runs first alternates),
both with ``T.train(224)``, batch 64, the CPU backend; it prints each configuration's median
images/s and CPU seconds per 1,000 images (main process and workers: shared cores perturb it less
than the rate), and the medians of the per-round ratios. Run it under ``flock /tmp/fastload-bench.lock``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench_fields import cpu_seconds


def second_dataset(photos: Path, workdir: Path) -> Path:
    """PHOTO_FOLDER converted into WORKDIR/second (made once)."""
    from fastload.converters import ConvertOptions, convert

    out = workdir / "second"
    if not (out / "index.json").exists():
        convert(str(photos), str(out), ConvertOptions(source="imagefolder", shuffle=True, seed=1, shard_bytes=16 * 10**6, workers=2))
    return out


def run_one(dataset: Any, workers: int, epochs: int) -> tuple[float, float]:
    """(images/s, CPU seconds per 1,000 images) of a fresh loader over ``epochs`` epochs of ``dataset``
    (the CPU time counts its workers, joined at close)."""
    import fastload
    from fastload import transforms as T

    loader = fastload.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=workers, transform=T.train(224), backend="cpu")
    start, cpu_start, images = time.perf_counter(), cpu_seconds(), 0
    for _ in range(epochs):
        for images_batch, _labels in loader:
            images += len(images_batch)
    seconds = time.perf_counter() - start
    loader.close()
    return images / seconds, (cpu_seconds() - cpu_start) / images * 1000


def main() -> None:
    """Convert the second dataset, run the rounds, print the table."""
    import fastload

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("converted", type=Path)
    parser.add_argument("photos", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    second = second_dataset(args.photos, args.workdir)
    one = fastload.open(args.converted)
    mixture = fastload.mix({one: 1, fastload.open(second): 1}, samples_per_epoch=len(one))
    runs: dict[str, list[tuple[float, float]]] = {"one dataset": [], "mix of two": []}
    configs = [("one dataset", one), ("mix of two", mixture)]
    for round_no in range(args.rounds):
        for name, dataset in configs if round_no % 2 == 0 else configs[::-1]:  # alternate which runs first
            runs[name].append(run_one(dataset, args.workers, args.epochs))
    print(f"{len(one)} images an epoch, {args.epochs} epochs, {args.workers} workers, {args.rounds} rounds interleaved")
    for name, values in runs.items():
        print(f"{name:12s} {statistics.median(r for r, _ in values):6.0f} images/s {statistics.median(c for _, c in values):6.2f} "
              f"CPU s/1k images  (rates: {', '.join(f'{r:.0f}' for r, _ in values)})")
    pairs = list(zip(runs["mix of two"], runs["one dataset"], strict=True))
    rate_ratios, cpu_ratios = [m[0] / o[0] for m, o in pairs], [o[1] / m[1] for m, o in pairs]
    print(f"mix / one, images/s: {statistics.median(rate_ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in rate_ratios)})")
    print(f"mix / one, images per CPU second: {statistics.median(cpu_ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in cpu_ratios)})")


if __name__ == "__main__":
    main()
