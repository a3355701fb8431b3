"""Loader throughput, side by side in one run, on the same photos:

    fastload.DataLoader over the converted shards (train(224) without Normalize: uint8 CHW)
    torch.utils.data.DataLoader over the image folder, a Pillow dataset doing the same crop and
        flip (what users write by hand; torchvision's PIL path does the same work)
    the decode ceiling: single-thread libjpeg-turbo full decodes/s of the same images x workers

Each round runs every contender for ``--epochs`` epochs with a fresh loader; rounds are
interleaved so machine noise hits every contender alike; the median is reported.
Also: time to the first batch and the peak RSS of the process tree (main + workers).

    python benchmarks/bench_loader.py data/photos data/photos-wds --workers 2 --batch-size 256
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import fastload
from fastload import transforms as T
from fastload.sampling import sample_rng
from fastload.transforms import random_resized_crop_params


class PillowFolder(torch.utils.data.Dataset):
    """The hand-written baseline: Pillow decode, RandomResizedCrop(224) + flip, CHW uint8 tensor."""

    def __init__(self, root: Path, size: int = 224) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(str(p), label) for label, c in enumerate(classes) for p in sorted((root / c).iterdir())]
        self.size = size
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        rng = sample_rng(0, self.epoch, i)
        with Image.open(path) as im:
            im = im.convert("RGB")
            top, left, h, w = random_resized_crop_params(im.height, im.width, (0.08, 1.0), (3 / 4, 4 / 3), rng)
            im = im.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
            if rng.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1), label


def tree_rss_mb() -> float:
    """Resident memory of this process and all its children, in MB."""
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
    """Samples the process tree's RSS every 250 ms in a thread; ``peak`` is the maximum seen.
    (Shared pages, e.g. the batch buffers, count once per process: an upper bound.)"""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mb())
            self._stop.wait(0.25)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_mb())


def time_loader(make, epochs: int) -> dict:
    """Iterate ``epochs`` epochs of a fresh loader (its start-up and each loader's per-epoch costs,
    such as torch restarting its workers, count); images/s and time to the first batch."""
    with PeakRss() as rss:
        start = time.perf_counter()
        loader = make()
        first = None
        images = 0
        for _ in range(epochs):
            for x, _ in loader:
                if first is None:
                    first = time.perf_counter() - start
                images += len(x)
        seconds = time.perf_counter() - start
        if hasattr(loader, "close"):
            loader.close()
        del loader
    return {"images": images, "seconds": seconds, "images_per_s": images / seconds, "first_batch_s": first, "peak_rss_mb": rss.peak}


def decode_ceiling(folder: Path, limit: int = 600) -> float:
    """Single-thread full libjpeg-turbo decodes per second over (a sample of) the same images."""
    import simplejpeg

    paths = sorted(folder.rglob("*.jpg"))
    step = max(1, len(paths) // limit)
    data = [p.read_bytes() for p in paths[::step]]
    start = time.perf_counter()
    for d in data:
        simplejpeg.decode_jpeg(d, colorspace="RGB")
    return len(data) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the image folder (benchmarks/make_photos.py)")
    parser.add_argument("shards", type=Path, help="the same folder converted with fastload convert")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per loader per round")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)

    contenders = {
        "fastload": lambda: fastload.DataLoader(
            args.shards, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, transform=T.train(224)
        ),
        "torch+Pillow": lambda: torch.utils.data.DataLoader(
            PillowFolder(args.folder), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
        ),
    }
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    ceilings = []
    for _ in range(args.rounds):
        ceilings.append(decode_ceiling(args.folder))
        for name, make in contenders.items():
            results[name].append(time_loader(make, args.epochs))
    ceiling = statistics.median(ceilings) * args.workers
    torch_rate = statistics.median(r["images_per_s"] for r in results["torch+Pillow"])
    print(f"{len(PillowFolder(args.folder))} images, batch {args.batch_size}, {args.workers} workers, median of {args.rounds} rounds")
    print(f"decode ceiling: {ceiling:.0f} images/s ({ceiling / args.workers:.0f}/s per thread x {args.workers})")
    print(f"{'loader':14} {'images/s':>9} {'x torch':>8} {'x ceiling':>10} {'1st batch':>10} {'peak RSS':>9}")
    rows = []
    for name, runs in results.items():
        rate = statistics.median(r["images_per_s"] for r in runs)
        first = statistics.median(r["first_batch_s"] for r in runs)
        peak = max(r["peak_rss_mb"] for r in runs)
        rows.append({"loader": name, "images_per_s": rate, "ratio_to_torch": rate / torch_rate,
                     "ratio_to_ceiling": rate / ceiling, "first_batch_s": first, "peak_rss_mb": peak})
        print(f"{name:14} {rate:9.0f} {rate / torch_rate:8.2f} {rate / ceiling:10.2f} {first:9.2f}s {peak:7.0f}MB")
    if args.json:
        args.json.write_text(json.dumps({"ceiling": ceiling, "results": rows, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
