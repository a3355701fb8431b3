"""Conversion throughput, side by side in one run: an image folder -> WebDataset tars, no re-encoding.

    fastload convert --workers 2      (this project)
    webdataset.ShardWriter            (one process, what users write by hand)
    tar cf                            (the I/O ceiling: no cleaning, no index)

Every contender reads the same page-cached files and fsyncs what it wrote, so all produce durable
output; runs are interleaved over several rounds and the median is reported, as MB/s of input and
as a ratio to ``tar cf``. Dirty pages are flushed (``sync``) and the disk left to settle
before each timed run.

    python benchmarks/bench_convert.py data/photos --rounds 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTLE_S = 2.0  # after deleting a previous output (the disk is mounted with online discard)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def run_tar(src: Path, out: Path) -> None:
    """``tar cf`` of the whole folder into one archive."""
    out.mkdir()
    subprocess.run(["tar", "cf", str(out / "all.tar"), "-C", str(src), "."], check=True)
    fsync_tree(out)


def run_webdataset(src: Path, out: Path, shard_bytes: int) -> None:
    """webdataset.ShardWriter in this process: read each file, write key.jpg and key.cls."""
    import webdataset as wds

    out.mkdir()
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=shard_bytes, maxcount=10**9, verbose=0) as sink:
        for label, name in enumerate(classes):
            for path in sorted((src / name).iterdir()):
                sink.write({"__key__": f"{name}/{path.stem}", "jpg": path.read_bytes(), "cls": label})
    fsync_tree(out)


def run_fastload(src: Path, out: Path, shard_bytes: int, workers: int) -> None:
    """The ``fastload convert`` command (it fsyncs every shard itself)."""
    exe = Path(sys.executable).with_name("fastload")
    subprocess.run(
        [str(exe), "convert", str(src), str(out), "--from", "imagefolder", "--to", "wds",
         "--shard-size", str(shard_bytes), "--workers", str(workers), "--quiet"],
        check=True, stdout=subprocess.DEVNULL,
    )


def warm_cache(src: Path) -> int:
    """Read every file once so all contenders start from the page cache; return the total bytes."""
    return sum(len(p.read_bytes()) for p in src.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="an image folder (benchmarks/make_photos.py builds one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shard-bytes", type=int, default=64 * 10**6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    total = warm_cache(args.src)
    contenders = {
        "tar cf": lambda out: run_tar(args.src, out),
        "webdataset.ShardWriter (1 process)": lambda out: run_webdataset(args.src, out, args.shard_bytes),
        f"fastload convert --workers {args.workers}": lambda out: run_fastload(args.src, out, args.shard_bytes, args.workers),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with tempfile.TemporaryDirectory(dir=args.src.parent) as tmp:
        for round_ in range(args.rounds):
            for name, run in contenders.items():
                out = Path(tmp) / f"r{round_}"
                os.sync()  # no contender pays for the previous one's dirty pages or deletions
                time.sleep(SETTLE_S)
                start = time.perf_counter()
                run(out)
                times[name].append(time.perf_counter() - start)
                shutil.rmtree(out)
    ceiling = total / statistics.median(times["tar cf"])
    rows = []
    print(f"{total / 1e6:.1f} MB in {sum(1 for p in args.src.rglob('*.jpg'))} files, median of {args.rounds} rounds")
    print(f"{'contender':40} {'MB/s':>8} {'x tar cf':>9}")
    for name, samples in times.items():
        rate = total / statistics.median(samples)
        rows.append({"contender": name, "mb_per_s": rate / 1e6, "ratio_to_tar": rate / ceiling, "seconds": samples})
        print(f"{name:40} {rate / 1e6:8.1f} {rate / ceiling:9.2f}")
    if args.json:
        args.json.write_text(json.dumps({"bytes": total, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
