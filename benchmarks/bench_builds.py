"""Two builds of the libjpeg-turbo extension side by side on the same crops: e.g. a wheel's (its
libjpeg-turbo bundled by auditwheel) against the in-place build linked to the system libjpeg.
Both load into one process, each bound to its own libjpeg; rounds interleaved, best round kept.

    python benchmarks/bench_builds.py data/photos-wds fastload/decode/_turbo.*.so \\
        VENV/lib/python3.11/site-packages/fastload/decode/_turbo.*.so --rounds 10
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import time
from pathlib import Path
from types import ModuleType

import numpy as np

import fastload
from fastload import transforms as T
from fastload.bench.samples import plan_sample
from fastload.decode.header import MAX_PIXELS


def load_build(path: Path, alias: str) -> ModuleType:
    """The extension at ``path`` as module ``alias._turbo`` (its init function is found by the last part)."""
    loader = importlib.machinery.ExtensionFileLoader(f"{alias}._turbo", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards")
    parser.add_argument("builds", nargs=2, type=Path, help="the two _turbo*.so files")
    parser.add_argument("--images", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--size", type=int, default=224, help="train(SIZE) crops")
    args = parser.parse_args()
    builds = {str(path): load_build(path, f"build{i}") for i, path in enumerate(args.builds)}
    ds = fastload.open(args.shards)
    specs = T.train(args.size)
    samples = [plan_sample(ds, i, specs, 0, 0) for i in range(min(args.images, len(ds)))]
    outs = {name: np.zeros((3, args.size, args.size), np.uint8) for name in builds}
    times: dict[str, list[float]] = {name: [] for name in builds}
    for round_ in range(args.rounds):
        for name in list(builds)[:: 1 if round_ % 2 else -1]:  # alternate which goes first
            turbo, out = builds[name], outs[name]
            start = time.perf_counter()
            for s in samples:
                turbo.decode_crop_into(s.data, s.plan.box, out, args.size, args.size, s.plan.flip, MAX_PIXELS)
            times[name].append((time.perf_counter() - start) / len(samples) * 1e3)
    first = min(times[str(args.builds[0])])
    print(f"{len(samples)} images, train({args.size}) crop decode + resample, best of {args.rounds} interleaved rounds, one thread")
    for name, values in times.items():
        print(f"  {min(values):.3f} ms/image  ({min(values) / first:.3f}x the first)  {name}")


if __name__ == "__main__":
    main()
