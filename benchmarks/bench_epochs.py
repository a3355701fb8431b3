"""Seconds each epoch of one loader takes, the first (the workers' start, their first reads of
every file or row group) apart from the rest, for datasets side by side, each in a fresh process,
rounds alternating:

    python benchmarks/bench_epochs.py data/inplace/parquet data/inplace/wds [--epochs 3] [--rounds 2] [--workers 2]

Each loader: ``T.train(224)``, batch 64, shuffled (seed 1), the CPU backend. Where data read in
place spends its time against the same rows converted (docs/in-place.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ONE_RUN = """
import json, sys, time
import fastload
from fastload import transforms as T
location, workers, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
loader = fastload.DataLoader(location, batch_size=64, transform=T.train(224), num_workers=workers, shuffle=True, seed=1)
seconds = []
for epoch in range(epochs):
    loader.set_epoch(epoch)
    began = time.perf_counter()
    for _ in loader:
        pass
    seconds.append(time.perf_counter() - began)
print(json.dumps(seconds))
"""


def main() -> None:
    """Time each dataset's epochs as the arguments say; print them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("datasets", nargs="+")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    for r in range(args.rounds):
        for location in args.datasets:
            began = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", ONE_RUN, location, str(args.workers), str(args.epochs)],
                                 capture_output=True, text=True, check=True)
            seconds = json.loads(out.stdout.strip().splitlines()[-1])
            shown = ", ".join(f"{s:.3f}" for s in seconds)
            print(f"round {r + 1}: {location}: epochs {shown} s (the process: {time.perf_counter() - began:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
