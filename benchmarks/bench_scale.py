"""Loading at scale without GBs of disk: one 10,000-sample shard of small real-photo JPEGs,
hard-linked 128 / 1,024 / 4,096 times (1.28M / 10.24M / 40.96M samples) under a generated
index.json, loaded with the global shuffle and with the streaming order side by side.

    python benchmarks/bench_scale.py /tmp/scale --sizes 1.28M,40.96M --rounds 3

Prints per dataset size and order: time to the first batch (from the loader's construction, torch
already imported as in any training process), PSS of each worker and of the
training process (from /proc/PID/smaps_rollup, after the last batch), images/s over batches
2-201, and that rate over the smallest size's in the same order. Each run is a fresh process;
``--rounds N`` runs every row N times, interleaved, and prints medians and each round's ratios.
The photos come from ``make_photos.py`` (or ``--photos DIR``), converted with ``--max-size``
(small JPEGs: the loader's own cost per sample shows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

SHARD_SAMPLES = 10_000
SIZES = {"1.28M": 128, "10.24M": 1024, "40.96M": 4096}
ORDERS = ("global", "streaming")
SHARD_FILES = (".tar", ".idx", ".table")
REPO_ROOT = Path(__file__).resolve().parent.parent


def checkout_env() -> dict[str, str]:
    """The environment in which child processes import this checkout's fastload."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}


def base_dataset(work: Path, photos: Path | None, max_size: int) -> Path:
    """WORK/base-wds: one shard of SHARD_SAMPLES small JPEGs (photos made and converted once)."""
    base = work / "base-wds"
    if (base / "index.json").exists():
        return base
    if photos is None:
        photos = work / "photos"
        if not photos.exists():
            script = Path(__file__).with_name("make_photos.py")
            subprocess.run([sys.executable, str(script), str(photos), "--count", str(SHARD_SAMPLES)], check=True)
    subprocess.run(
        [sys.executable, "-m", "fastload.cli.command", "convert", str(photos), str(base), "--from", "imagefolder", "--limit", str(SHARD_SAMPLES),
         "--samples-per-shard", str(SHARD_SAMPLES), "--max-size", str(max_size), "--quiet"],
        check=True, env=checkout_env(),
    )
    return base


def linked_dataset(base: Path, work: Path, copies: int) -> Path:
    """WORK/scale-COPIES: the base shard's files hard-linked COPIES times, and an index listing them."""
    out = work / f"scale-{copies}"
    if (out / "index.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    index = json.loads((base / "index.json").read_text())
    (shard,) = index["shards"]
    if shard["samples"] != SHARD_SAMPLES:
        raise SystemExit(f"{base}: its shard holds {shard['samples']} samples, not {SHARD_SAMPLES} (give more photos)")
    shards = []
    for k in range(copies):
        entry = dict(shard)
        for suffix in SHARD_FILES:
            name = f"shard-{k:05d}{suffix}"
            os.link(base / Path(shard["path"]).with_suffix(suffix), out / name)
            entry[{".tar": "path", ".idx": "offsets", ".table": "table"}[suffix]] = name
        shards.append(entry)
    index["shards"] = shards
    index["class_counts"] = {label: count * copies for label, count in index["class_counts"].items()}
    index.pop("num_samples", None)
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return out


def pss_mb(pid: int) -> float:
    """The proportional set size of process ``pid`` in MB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/smaps_rollup: no Pss line")


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the loader's workers)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (from /proc/PID/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)
    return total / ticks


def run_one(path: str, order: str, workers: int, batch_size: int, batches: int, size: int) -> dict:
    """Load ``batches`` + 1 batches in this process; the measurements as a dict."""
    import torch  # noqa: F401 - a training process has imported torch (~0.9 s here): the clock starts at the loader

    import fastload
    from fastload import transforms as T
    from fastload.loader import DataLoader  # noqa: F401 - fastload.DataLoader is imported lazily

    start = time.perf_counter()
    extra: dict[str, Any] = {"shuffle_buffer": 4096} if order == "streaming" else {}
    loader = fastload.DataLoader(path, batch_size=batch_size, shuffle=True, num_workers=workers, transform=T.train(size), **extra)
    batch_iter = iter(loader)
    next(batch_iter)
    first = time.perf_counter() - start
    processes = [os.getpid(), *children(os.getpid())]
    begin, cpu = time.perf_counter(), cpu_seconds(processes)
    for _ in range(batches):
        next(batch_iter)
    rate = batches * batch_size / (time.perf_counter() - begin)
    cpu_ms = (cpu_seconds(processes) - cpu) * 1e6 / (batches * batch_size)  # per 1,000 images, all processes
    worker_pss = [pss_mb(pid) for pid in processes[1:]]
    result = {"samples": len(loader.sharded), "first_batch_s": first, "worker_pss_mb": max(worker_pss), "main_pss_mb": pss_mb(os.getpid()),
              "images_per_s": rate, "cpu_ms_per_1k": cpu_ms}
    loader.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path, help="folder for the photos and the linked datasets (a few hundred MB)")
    parser.add_argument("--sizes", default="1.28M,40.96M", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--photos", type=Path, help="an image folder of at least 10,000 photos (default: made by make_photos.py)")
    parser.add_argument("--max-size", type=int, default=64, help="the photos' longer side after conversion (px)")
    parser.add_argument("--size", type=int, default=32, help="RandomResizedCrop's output side")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200, help="timed batches after the first")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every row, interleaved (the table: medians; PSS: the largest)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # child mode: DATASET,ORDER
    args = parser.parse_args()
    if args.run:
        path, order = args.run.rsplit(",", 1)
        print(json.dumps(run_one(path, order, args.workers, args.batch_size, args.batches, args.size)))
        return
    sizes = [s.strip() for s in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {', '.join(unknown)} (choose from {', '.join(SIZES)})")
    args.work.mkdir(parents=True, exist_ok=True)
    base = base_dataset(args.work, args.photos, args.max_size)
    env = checkout_env()
    datasets = {name: linked_dataset(base, args.work, SIZES[name]) for name in sizes}
    runs: dict[tuple[str, str], list[dict]] = {(name, order): [] for name in sizes for order in ORDERS}
    for _ in range(args.rounds):  # rounds interleave sizes and orders: a busy moment spreads over all rows
        for name in sizes:
            for order in ORDERS:
                child = [sys.executable, __file__, str(args.work), "--run", f"{datasets[name]},{order}", "--workers", str(args.workers),
                         "--batch-size", str(args.batch_size), "--batches", str(args.batches), "--size", str(args.size)]
                proc = subprocess.run(child, capture_output=True, text=True, env=env)
                if proc.returncode:
                    raise SystemExit(f"{name} {order}: the run failed:\n{proc.stderr}")
                runs[name, order].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    smallest = sizes[0]
    print(f"| samples | order | first batch | PSS per worker | PSS main process | images/s over batches 2-{args.batches + 1} "
          f"| x the {smallest} rate | CPU ms / 1k images |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, order), results in runs.items():
        rate = median(r["images_per_s"] for r in results)
        base_rate = median(r["images_per_s"] for r in runs[smallest, order])
        print(f"| {name} | {order} | {median(r['first_batch_s'] for r in results):.2f} s | {max(r['worker_pss_mb'] for r in results):.0f} MB "
              f"| {max(r['main_pss_mb'] for r in results):.0f} MB | {rate:,.0f} | {rate / base_rate:.2f} | {median(r['cpu_ms_per_1k'] for r in results):.0f} |")
    if args.rounds > 1:
        for name, order in runs:
            if name != smallest:
                ratios = [r["images_per_s"] / b["images_per_s"] for r, b in zip(runs[name, order], runs[smallest, order])]
                print(f"{name} {order}: x the {smallest} rate per round: " + ", ".join(f"{x:.2f}" for x in ratios))

if __name__ == "__main__":
    main()
