"""Start-up of the sample orders alone, at any simulated size: the time from nothing to the first
batch's sample indices (rank 0 of 8, batch 256) and the memory that takes, then the time each of the
next 20 batches' indices takes (what the loader's main process spends a batch), for the global and the
streaming order, from a fake list of 10,000-sample shards (no data on disk), and for a
``fastload.mix`` order (two members of 5/6 and 1/6 of the samples, weights 5:1, an epoch of
that many positions; this checkout only).

Each case runs in a fresh process, so times and peak memory are its own. ``--old DIR`` runs the
same cases against another checkout's fastload (e.g. ``git worktree add --detach /tmp/old 4869abe``)
side by side, interleaved; old cases whose N-long arrays would not fit in memory are skipped.

    python benchmarks/bench_order.py --old /tmp/old              # the table in docs/loading.md
    python benchmarks/bench_order.py --sizes 1280000 --repeats 1  # one quick case
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SHARD = 10_000
BATCH, WORLD = 256, 8
SIZES = (1_280_000, 40_960_000, 1_000_000_000)
PER_BATCH_SAMPLE = 20  # batches after the first, timed for the per-batch cost


def first_batch(order_kind: str, samples: int) -> dict:
    """Build the order of epoch 0 and rank 0's first batch; seconds and peak RSS growth (imports
    done before: they are the same for any size)."""
    import numpy as np

    try:  # this checkout: orders evaluated per batch
        from fastload.orders.spec import OrderSpec
    except ImportError:  # before: OrderSpec in fastload.sampling, orders as N-long arrays
        from fastload.sampling import OrderSpec  # type: ignore[import-not-found,no-redef]
    shards = (SHARD,) * (samples // SHARD)
    streaming = order_kind == "streaming"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    spec = OrderSpec(shards, 0, True, BATCH, 0, WORLD, False, streaming, 4096 if streaming else 1)
    if order_kind == "mixture":
        from fastload.orders.mixing import apportion
        from fastload.orders.mixture_order import MixtureOrder

        big = samples * 5 // 6 // SHARD
        members = ((SHARD,) * big, (SHARD,) * (samples // SHARD - big))
        spec = MixtureOrder(spec, members, tuple(apportion(samples, (5.0, 1.0))), (0, 0))  # type: ignore[assignment]
    order = spec.order(0)
    plan = spec.batches(len(order), 0)
    new = hasattr(order, "indices")
    indices = order.indices(plan.positions(0)) if new else order.order[plan.batches[0]]  # type: ignore[attr-defined]
    seconds = time.perf_counter() - started
    assert len(indices) == BATCH and int(np.min(indices)) >= 0 and int(np.max(indices)) < samples
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    started = time.perf_counter()
    for batch in range(1, 1 + PER_BATCH_SAMPLE):  # the next batches: what the main process spends on each
        _ = order.indices(plan.positions(batch)) if new else order.order[plan.batches[batch]]  # type: ignore[attr-defined]
    return {"seconds": seconds, "peak_mb": grown / 1024, "batch_us": (time.perf_counter() - started) / PER_BATCH_SAMPLE * 1e6}


def run_case(pythonpath: str, order_kind: str, samples: int) -> dict:
    """One case in a fresh process with ``pythonpath`` first on its path."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([sys.executable, __file__, "--case", order_kind, str(samples)], env=env, cwd=pythonpath,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fits_old(samples: int) -> bool:
    """The old orders hold ~3 N-long int64 arrays at their peak: run them only where that fits."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return samples * 8 * 3 < available / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", help="a checkout of the code to compare with")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case (the best is reported)")
    parser.add_argument("--case", nargs=2, metavar=("ORDER", "SAMPLES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(first_batch(args.case[0], int(args.case[1]))))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    versions = {"this": here, **({"old": os.path.abspath(args.old)} if args.old else {})}
    print(f"{'order':<10} {'samples':>13} " + " ".join(f"{name + ' s':>10} {name + ' MB':>9} {name + ' us/b':>10}" for name in versions)
          + ("   speed-up" if args.old else ""))
    for order_kind in ("global", "streaming", "mixture"):
        for samples in args.sizes:
            runs: dict[str, list[dict]] = {name: [] for name in versions
                                           if name == "this" or (fits_old(samples) and order_kind != "mixture")}
            for _ in range(args.repeats):  # interleaved: both versions see the same machine load
                for name, found in runs.items():
                    found.append(run_case(versions[name], order_kind, samples))
            best = {name: min(found, key=lambda got: got["seconds"]) for name, found in runs.items()}
            cells = [f"{best[name]['seconds']:>10.3f} {best[name]['peak_mb']:>9.0f} {best[name].get('batch_us', 0):>10.0f}"
                     if name in best else f"{'(skipped)':>10} {'':>9} {'':>10}"
                     for name in versions]
            ratio = f"   {best['old']['seconds'] / best['this']['seconds']:>7.0f}x" if "old" in best else ""
            print(f"{order_kind:<10} {samples:>13,} " + " ".join(cells) + ratio, flush=True)


if __name__ == "__main__":
    main()
