"""Token loading at scale without tens of GBs of disk: one token shard of real text (the documentation
packages of bench_tokens.py, cut into documents of about 100 tokens), hard-linked under a generated
index.json until the dataset holds 10^8 tokens / 10^6 documents and 10^10 tokens / 10^8 documents,
loaded with packing concat and best-fit side by side.

    python benchmarks/bench_scale_tokens.py /tmp/scale-tokens --rounds 3

Prints per dataset size and packing: the time to the first batch (from the loader's construction,
torch already imported as in any training process), PSS of each worker and of the training
process (from /proc/PID/smaps_rollup, after the last batch), delivered tokens/s over batches 2-201
(batch 8, L = 2048, 2 workers) and that rate over the smallest size's in the same packing. Each run
is a fresh process; ``--rounds N`` runs every row N times, interleaved, and prints medians.
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

from bench_scale import checkout_env, children, pss_mb
from bench_tokens import prepare

SIZES = {"1e8": 10**8, "1e10": 10**10}  # tokens
PACKINGS = ("concat", "best-fit")
DOC_CHARS = 380  # under 100 tokens a document: 10^8 documents in 10^10 tokens


def base_dataset(work: Path) -> Path:
    """WORK/base-tokens: one token shard of the corpus's text in documents of about DOC_CHARS characters."""
    base = work / "base-tokens"
    if (base / "index.json").exists():
        return base
    corpus, tokenizer, _ = prepare(work)
    small = work / "small-docs.jsonl"
    with corpus.open() as src, small.open("w") as out:
        for line in src:
            current = ""
            for text_line in json.loads(line)["text"].splitlines(keepends=True):
                current += text_line
                if len(current) >= DOC_CHARS:
                    out.write(json.dumps({"text": current}) + "\n")
                    current = ""
            if current.strip():
                out.write(json.dumps({"text": current}) + "\n")
    subprocess.run([sys.executable, "-m", "fastload.cli", "convert", str(small), str(base), "--from", "jsonl", "--tokenizer",
                    str(tokenizer), "--append-eos", "--shard-tokens", "1G", "--workers", "2", "--quiet"], check=True, env=checkout_env())
    return base


def linked_dataset(base: Path, work: Path, tokens: int) -> Path:
    """WORK/scale-TOKENS: the base shard's two files hard-linked until the dataset holds ``tokens``, and an index listing them."""
    index = json.loads((base / "index.json").read_text())
    (shard,) = index["shards"]
    copies = -(-tokens // shard["tokens"])
    out = work / f"scale-{copies}"
    if (out / "index.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    shards = []
    for k in range(copies):
        entry = dict(shard)
        for key in ("path", "table"):
            name = f"shard-{k:05d}{Path(shard[key]).suffix}"
            os.link(base / shard[key], out / name)
            entry[key] = name
        shards.append(entry)
    index["shards"] = shards
    for total in ("num_samples", "num_tokens"):
        index.pop(total, None)
    (out / "index.json").write_text(json.dumps(index))
    return out


def run_one(path: str, packing: str, workers: int, batch_size: int, seq_len: int, batches: int) -> dict:
    """Load ``batches`` + 1 batches in this process; the measurements as a dict."""
    import torch  # noqa: F401 - a training process has imported torch: the clock starts at the loader

    import fastload

    start = time.perf_counter()
    loader = fastload.DataLoader(path, batch_size=batch_size, seq_len=seq_len, packing=packing, num_workers=workers)
    batch_iter = iter(loader)
    next(batch_iter)
    first = time.perf_counter() - start
    begin = time.perf_counter()
    for _ in range(batches):
        next(batch_iter)
    rate = batches * batch_size * seq_len / (time.perf_counter() - begin)
    worker_pss = [pss_mb(pid) for pid in children(os.getpid())]
    index = loader.sharded.index
    result = {"tokens": index.num_tokens, "documents": index.num_samples, "shards": len(index.shards), "first_batch_s": first,
              "worker_pss_mb": max(worker_pss), "main_pss_mb": pss_mb(os.getpid()), "tokens_per_s": rate}
    loader.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path, help="folder for the corpus, the base shard and the linked datasets")
    parser.add_argument("--sizes", default="1e8,1e10", help=f"comma-separated tokens, of {', '.join(SIZES)}")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batches", type=int, default=200, help="timed batches after the first")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # child mode: DATASET,PACKING
    args = parser.parse_args()
    if args.run:
        path, packing = args.run.rsplit(",", 1)
        print(json.dumps(run_one(path, packing, args.workers, args.batch_size, args.seq_len, args.batches)))
        return
    sizes = [s.strip() for s in args.sizes.split(",")]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = base_dataset(work)
    datasets = {name: linked_dataset(base, work, SIZES[name]) for name in sizes}
    runs: dict[tuple[str, str], list[dict]] = {(name, packing): [] for name in sizes for packing in PACKINGS}
    for _ in range(args.rounds):  # rounds interleave sizes and packings: a busy moment spreads over all rows
        for name in sizes:
            for packing in PACKINGS:
                child = [sys.executable, __file__, str(work), "--run", f"{datasets[name]},{packing}", "--workers", str(args.workers),
                         "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--batches", str(args.batches)]
                proc = subprocess.run(child, capture_output=True, text=True, env=checkout_env())
                if proc.returncode:
                    raise SystemExit(f"{name} {packing}: the run failed:\n{proc.stderr}")
                runs[name, packing].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    smallest = sizes[0]
    print(f"| tokens | documents | shards | packing | first batch | PSS per worker | PSS main process | tokens/s over batches "
          f"2-{args.batches + 1} | x the {smallest} rate |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (_, packing), results in runs.items():
        rate = median(r["tokens_per_s"] for r in results)
        base_rate = median(r["tokens_per_s"] for r in runs[smallest, packing])
        r0 = results[0]
        print(f"| {r0['tokens']:.3g} | {r0['documents']:.3g} | {r0['shards']} | {packing} | {median(r['first_batch_s'] for r in results):.2f} s "
              f"| {max(r['worker_pss_mb'] for r in results):.0f} MB | {max(r['main_pss_mb'] for r in results):.0f} MB "
              f"| {rate / 1e6:.1f}M | {rate / base_rate:.2f} |")


if __name__ == "__main__":
    main()
