"""Data stall per backend: ResNet-50 in bf16 with channels_last and torch.compile (what users train
with), compiled once, fed by each backend's loader in turn, against steps on one cached batch.

    python benchmarks/bench_stall.py DATASET --backends cpu,dali,hybrid --workers 14 --steps 30 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import fastload
from fastload import transforms as T
from fastload.bench.training import StepTimer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--backends", default="cpu,dali,hybrid")
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--no-compile", action="store_true", help="eager mode (torch.compile takes a minute or more)")
    parser.add_argument("--json")
    args = parser.parse_args()
    ds = fastload.open(args.dataset)
    began = time.perf_counter()
    timer = StepTimer(args.model, max(len(ds.classes or []), 2), channels_last=True, compile=not args.no_compile)
    results = []
    for backend in args.backends.split(","):
        with fastload.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, transform=T.train(224),
                                 backend=backend, device=timer.device, drop_last=True) as loader:
            result = timer.stall(loader, args.steps) | {"backend": loader.backend, "workers": args.workers}
        results.append(result)
        print(f"{result['backend']:>10}: fed {result['fed_images_per_s']:.0f} images/s, model alone "
              f"{result['model_images_per_s']:.0f}: {result['verdict']}", flush=True)
    print(f"({time.perf_counter() - began:.0f} s, compile included)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
