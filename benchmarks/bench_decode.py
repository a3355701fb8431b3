"""Where one image's time goes, on one thread: fastload's crop decode (only the crop's region,
resampled into the batch slot) against libjpeg-turbo's full decode (the ceiling's unit), and the
Python work of reading and planning a sample. Same images, rounds interleaved, best round kept.

    python benchmarks/bench_decode.py data/photos12k-wds --images 1024 --rounds 10
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import simplejpeg

import fastload
from fastload import transforms as T
from fastload.bench.samples import plan_sample
from fastload.decode.cpu import turbo as _turbo
from fastload.decode.header import MAX_PIXELS


def per_image_ms(work: Callable[[], None], count: int) -> float:
    start = time.perf_counter()
    work()
    return (time.perf_counter() - start) / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards")
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--size", type=int, default=224, help="train(SIZE) crops")
    args = parser.parse_args()
    if _turbo is None:
        raise SystemExit("the libjpeg-turbo extension is not built (see setup.py)")
    ds = fastload.open(args.shards)
    specs = T.train(args.size)
    indices = range(min(args.images, len(ds)))
    samples = [plan_sample(ds, i, specs, 0, 0) for i in indices]
    out = np.zeros((3, args.size, args.size), np.uint8)

    def plan_all() -> None:
        for i in indices:
            plan_sample(ds, i, specs, 0, 0)

    def crop_all() -> None:
        for s in samples:
            _turbo.decode_crop_into(s.data, s.plan.box, out, args.size, args.size, s.plan.flip, MAX_PIXELS)

    def full_all() -> None:
        for s in samples:
            simplejpeg.decode_jpeg(s.data, colorspace="RGB")

    times: dict[str, list[float]] = {"read + plan (Python)": [], "crop decode + resample": [], "full decode": []}
    for _ in range(args.rounds):
        for name, work in zip(times, (plan_all, crop_all, full_all)):
            times[name].append(per_image_ms(work, len(samples)))
    full = min(times["full decode"])
    print(f"{len(samples)} images, train({args.size}), best of {args.rounds} interleaved rounds, one thread")
    for name, values in times.items():
        print(f"  {name:24} {min(values):.3f} ms/image  ({min(values) / full:.2f}x a full decode)")


if __name__ == "__main__":
    main()
