"""One loader's throughput in this process, for paired runs of two checkouts of fastload ("nothing
slower": the code before a change against the code after it, rounds alternating):

    farm-bench -n 8 --timeout 900 --vs "env PYTHONPATH=OLD_TREE python benchmarks/bench_versions.py images DATA" \
        -- env PYTHONPATH=NEW_TREE python benchmarks/bench_versions.py images DATA

``images DATA``: a converted image dataset, ``train(224)``, batch 256, 2 workers, 2 epochs;
``tokens DATA``: a token dataset, rows of 2048 tokens, batch 8, 2 workers, 10 epochs (``--packing
best-fit`` for best-fit); ``videos DATA``: a video dataset, clips of 16 frames at stride 2,
``train(224)``, batch 8, 2 workers, 2 epochs (as benchmarks/bench_video.py). Prints the rate from
the first batch on (what the loader delivers once running), then the time from the loader's
construction to its first batch (imports included), and the fastload module that ran, so a pairing
that imported the wrong tree shows. Run it from outside the checkouts (``python -m`` and a script's
folder put a tree first on the path), with bytecode caching on for both.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any


def main() -> None:
    """Load as the arguments say; print the delivered rate."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("images", "tokens", "videos"))
    parser.add_argument("data")
    parser.add_argument("--packing", default="concat")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    import fastload
    from fastload import transforms as T

    start = time.perf_counter()
    if args.kind == "tokens":
        loader = fastload.DataLoader(args.data, batch_size=8, seq_len=2048, packing=args.packing, num_workers=args.workers)
        epochs, unit = 10, "tokens"
    else:
        clip = fastload.Clip(frames=16, stride=2) if args.kind == "videos" else None
        loader = fastload.DataLoader(args.data, batch_size=8 if clip else 256, shuffle=True, num_workers=args.workers,
                                     transform=T.train(224), clip=clip)
        epochs, unit = 2, args.kind

    def batches() -> Iterator[Any]:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            yield from loader

    stream = batches()
    next(stream)
    first = time.perf_counter() - start
    begin, count = time.perf_counter(), 0
    for batch in stream:
        count += batch["input_ids"].numel() if args.kind == "tokens" else len(batch[0])
    seconds = time.perf_counter() - begin
    print(f"{count / seconds:.0f} {unit}/s after the first batch, which took {first:.3f} s ({fastload.__file__})")
    loader.close()


if __name__ == "__main__":
    main()
