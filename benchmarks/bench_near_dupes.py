"""Near-duplicate detection on real photos with planted copies: recall, distinct photos dropped,
the cost of ``--dedupe near`` against a plain conversion, and ``fastload overlap``'s time.

Photos are crops of Debian's wallpapers (benchmarks/make_photos.py), so two "different" photos
of one wallpaper may show the same region: the distinct set keeps a photo only when its crop
box overlaps every kept box of its wallpaper by IoU < --max-iou. Every --plant-every'th
distinct photo gets a near copy, the kinds taking turns: re-encoded at quality 40-60, resized
to 80-95%, cropped by 2-5% (sides at random), brightness x0.9-1.1, or all four at once.

    python benchmarks/bench_near_dupes.py /tmp/near --count 2400 --rounds 3 \\
        [--overlap-a data/photos12k-wds --overlap-b-source data/photos12k] [--json out.json] \\
        [--cost-also data/photos12k] [--search-sizes 12000,100000,1280000]   # the decisions alone: C and Python
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_photos import crop_box, fetch_wallpapers, random_crop, source_photos

KINDS = ("quality", "resize", "crop", "brightness", "all")
REPO_ROOT = Path(__file__).resolve().parent.parent  # the ``fastload`` command runs this checkout's package


def iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """Intersection over union of two boxes."""
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def plant(image: Image.Image, kind: str, rng: random.Random) -> bytes:
    """A near copy of ``image`` of the given kind, as JPEG bytes."""
    if kind in ("crop", "all"):
        fx, fy = rng.uniform(0.02, 0.05), rng.uniform(0.02, 0.05)
        dx, dy = round(image.width * fx), round(image.height * fy)
        left, top = rng.randint(0, dx), rng.randint(0, dy)
        image = image.crop((left, top, image.width - (dx - left), image.height - (dy - top)))
    if kind in ("resize", "all"):
        scale = rng.uniform(0.8, 0.95)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BILINEAR)
    if kind in ("brightness", "all"):
        image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.9, 1.1))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=rng.randint(40, 60) if kind in ("quality", "all") else 90)
    return buf.getvalue()


def build(out: Path, count: int, max_iou: float, plant_every: int, wallpapers: Path, seed: int) -> dict:
    """Write the distinct photos and their planted copies under ``out/CLASS/``; return the truth:
    {"distinct": [keys], "planted": {copy key: (original key, kind)}, "generated": N}."""
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    sources = source_photos(wallpapers)
    per_source = -(-count // len(sources))
    distinct: list[str] = []
    planted: dict[str, tuple[str, str]] = {}
    for name, path in sources.items():
        with Image.open(path) as im:
            full = im.convert("RGB")
            full.thumbnail((2560, 2560))
        kept: list[tuple[int, int, int, int]] = []
        for n in range(per_source):
            box = crop_box(full.size, rng)
            photo = random_crop(full, rng, box)
            if any(iou(box, other) >= max_iou for other in kept):
                continue
            kept.append(box)
            key = f"{name}/{n:06d}"
            (out / name).mkdir(parents=True, exist_ok=True)
            photo.save(out / f"{key}.jpg", format="JPEG", quality=90)
            distinct.append(key)
            if len(distinct) % plant_every == 0:
                kind = KINDS[(len(distinct) // plant_every) % len(KINDS)]
                copy = f"{key}_{kind}"  # sorts right after its original: the original comes first
                (out / f"{copy}.jpg").write_bytes(plant(photo, kind, prng))
                planted[copy] = (key, kind)
    return {"distinct": distinct, "planted": planted, "generated": per_source * len(sources)}


def score(truth: dict, dropped: dict[str, str]) -> dict:
    """Recall of the planted copies (overall and by kind) and the share of distinct photos dropped."""
    by_kind: dict[str, list[bool]] = {}
    for copy, (_, kind) in truth["planted"].items():
        by_kind.setdefault(kind, []).append(copy in dropped)
    found = [hit for hits in by_kind.values() for hit in hits]
    distinct_dropped = [key for key in truth["distinct"] if key in dropped]
    return {
        "recall": sum(found) / len(found),
        "recall_by_kind": {kind: sum(h) / len(h) for kind, h in sorted(by_kind.items())},
        "distinct_dropped": len(distinct_dropped) / len(truth["distinct"]),
        "distinct_dropped_keys": distinct_dropped[:20],
    }


def threshold_sweep(folder: Path, truth: dict, thresholds: list[int]) -> dict[int, dict]:
    """Recall and distinct drops at each threshold, from one pass of signatures in plan order."""
    from fastload.near.search import first_occurrences
    from fastload.near.signature import reduced_rgb, signatures

    paths = sorted(folder.rglob("*.jpg"), key=lambda p: (p.parent.name, p.name))
    keys = [p.relative_to(folder).with_suffix("").as_posix() for p in paths]
    signed = signatures(np.stack([reduced_rgb(p.read_bytes(), str(p)) for p in paths]))
    out = {}
    for t in thresholds:
        dropped = {keys[d]: keys[k] for d, k, _ in first_occurrences(list(signed), t)}
        out[t] = {k: v for k, v in score(truth, dropped).items() if k != "distinct_dropped_keys"}
    return out


def search_seconds(size: int, threshold: int, python: bool) -> float:
    """Seconds for the first-occurrence decisions over ``size`` random signatures with a near copy
    (0..threshold bits off) planted every tenth, by the C index or (``python``) the Python one."""
    from fastload.near import search

    rng = random.Random(size)
    colour = int.from_bytes(bytes(rng.randrange(256) for _ in range(8)), "big")
    signed = [rng.getrandbits(64) << 64 | colour for _ in range(size)]
    for i in range(0, size - 1, 10):
        signed[i + 1] = signed[i] ^ sum(1 << 64 + bit for bit in rng.sample(range(64), rng.randint(0, threshold)))
    native, search.native = search.native, None if python else search.native
    try:
        start = time.perf_counter()
        search.first_occurrences(signed, threshold)
        return time.perf_counter() - start
    finally:
        search.native = native


def fastload(*args: str) -> float:
    """Run the ``fastload`` command; return its wall time."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}
    subprocess.run([str(Path(sys.executable).with_name("fastload")), *args], check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def plain_and_near(source: Path, work: Path, workers: int, threshold: int, rounds: int) -> tuple[float, dict[str, list[float]]]:
    """Convert ``source`` plainly and with ``--dedupe near``, interleaved over ``rounds`` (outputs
    under ``work`` removed before each run): the median of the rounds' near / plain, and the times."""
    times: dict[str, list[float]] = {"plain": [], "near": []}
    common = ["--from", "imagefolder", "--workers", str(workers), "--quiet"]
    for _ in range(rounds):
        for name, extra in (("plain", []), ("near", ["--dedupe", "near", "--near-threshold", str(threshold)])):
            out = work / f"out-{name}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            times[name].append(round(fastload("convert", str(source), str(out), *common, *extra), 3))
    return statistics.median(n / p for n, p in zip(times["near"], times["plain"], strict=True)), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path, help="a scratch folder (photos and outputs)")
    parser.add_argument("--count", type=int, default=2400, help="photos drawn before the distinct filter")
    parser.add_argument("--max-iou", type=float, default=0.5)
    parser.add_argument("--plant-every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="draws the crops and the copies (make_photos.py's own photos use 0)")
    parser.add_argument("--threshold", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--wallpapers", type=Path)
    parser.add_argument("--cache", type=Path, default=Path("data/.wallpapers"))
    parser.add_argument("--overlap-a", type=Path, help="a converted dataset (e.g. data/photos12k-wds)")
    parser.add_argument("--overlap-b-source", type=Path, help="an image folder converted (shuffled, HDF5) as B")
    parser.add_argument("--cost-also", type=Path, help="another image folder to time plain against near on (e.g. data/photos12k)")
    parser.add_argument("--search-sizes", help="also time the decisions alone at these sizes (e.g. 12000,100000,1280000)")
    parser.add_argument("--search-python-up-to", type=int, default=100_000, help="and the Python index's up to this size")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result: dict = {}
    for size in map(int, args.search_sizes.split(",")) if args.search_sizes else ():
        row = {"c": search_seconds(size, args.threshold, python=False)}
        if size <= args.search_python_up_to:
            row["python"] = search_seconds(size, args.threshold, python=True)
        result.setdefault("search_seconds", {})[size] = row
        print(f"decisions for {size:,} signatures: " + ", ".join(f"{k} index {v:.2f} s" for k, v in row.items()))
    folder = args.work / "photos"
    truth_file = args.work / "truth.json"
    if not truth_file.exists():
        truth = build(folder, args.count, args.max_iou, args.plant_every, args.wallpapers or fetch_wallpapers(args.cache), args.seed)
        truth_file.write_text(json.dumps(truth))
    truth = json.loads(truth_file.read_text())
    print(f"{truth['generated']} photos drawn, {len(truth['distinct'])} distinct (crop IoU < {args.max_iou}), {len(truth['planted'])} planted copies")
    result.update({"distinct": len(truth["distinct"]), "planted": len(truth["planted"]), "threshold": args.threshold})
    result["sweep"] = threshold_sweep(folder, truth, [8, 10, 11, 12, 13, 14, 16])
    for t, row in result["sweep"].items():
        kinds = ", ".join(f"{k} {v:.3f}" for k, v in row["recall_by_kind"].items())
        print(f"threshold {t:>2}: recall {row['recall']:.3f} ({kinds}); distinct dropped {row['distinct_dropped']:.4f}")

    result["cost"] = {}
    for name, source in (("planted", folder), *((("also", args.cost_also),) if args.cost_also else ())):
        ratio, seconds = plain_and_near(source, args.work / name, args.workers, args.threshold, args.rounds)
        result["cost"][name] = {"source": str(source), "seconds": seconds, "near_over_plain": ratio}
        print(f"{source}: convert --workers {args.workers}: plain {seconds['plain']} s, --dedupe near {seconds['near']} s; "
              f"near / plain, median of rounds: {ratio:.2f}")
    lines = (args.work / "planted" / "out-near" / "duplicates.jsonl").read_text().splitlines()
    dropped = {line["key"]: line["duplicate_of"] for line in map(json.loads, lines)}
    result["convert"] = score(truth, dropped)
    print(f"convert --dedupe near at threshold {args.threshold}: recall {result['convert']['recall']:.3f}, "
          f"distinct dropped {result['convert']['distinct_dropped']:.4f}")

    if args.overlap_a and args.overlap_b_source:
        b = args.work / "overlap-b"
        if not (b / "index.json").exists():
            fastload("convert", str(args.overlap_b_source), str(b), "--from", "imagefolder", "--to", "hdf5", "--shuffle", "--quiet")
        overlap_s = fastload("overlap", str(args.overlap_a), str(b), "--workers", str(args.workers), "--write-exclude", str(args.work / "exclude.txt"))
        overlapping = len((args.work / "exclude.txt").read_text().splitlines())
        result["overlap"] = {"seconds": overlap_s, "overlapping": overlapping}
        print(f"overlap {args.overlap_a} vs {b} (HDF5, shuffled): {overlapping} overlapping, {overlap_s:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
