"""Token rows from token shards against the same documents read in place from Parquet (#40): their
``input_ids`` (int32 lists) and their text (encoded in the workers), one epoch a loader, its start
included, alternating rounds; tokens/s of each and the in-place ones' ratio to the shards' each round.
``--sampler`` reads each epoch through torch's own DataLoader over the loader's parts instead
(``loader.dataset``, ``loader.batch_sampler``, ``loader.collate_fn``: the path Hugging Face's Trainer resumes by).

WORK is bench_tokens.py's folder (``python benchmarks/bench_tokens.py WORK`` makes it): its token shards
(WORK/tokens), corpus.jsonl and tokenizer.json. The Parquet files are written once under WORK/in-place/,
and the document tables are made before the rounds (the open that makes them is timed apart)::

    python benchmarks/bench_tokens_in_place.py data/tokbench --rounds 3
    python benchmarks/bench_tokens_in_place.py data/tokbench --rounds 3 --kinds shards text --sampler
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

KINDS = ("shards", "ids", "text")

ROW_GROUP = 500  # documents a row group (datasets' to_parquet writes groups of about this many short rows)


def write_parquet(work: Path, out: Path) -> None:
    """WORK's token shards' documents as ``input_ids`` and corpus.jsonl's texts as ``text``, one Parquet file each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import fastload

    ds = fastload.open(work / "tokens")
    readers: list[Any] = [ds.reader(s) for s in range(len(ds.index.shards))]  # token shards' readers
    docs = [reader.document(d).tolist() for reader in readers for d in range(len(reader))]
    (out / "ids").mkdir(parents=True)
    pq.write_table(pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))}), out / "ids" / "train.parquet", row_group_size=ROW_GROUP)
    with open(work / "corpus.jsonl", encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for line in lines]
    (out / "text").mkdir()
    pq.write_table(pa.table({"text": texts}), out / "text" / "train.parquet", row_group_size=ROW_GROUP)


def epoch(location: Path, workers: int, sampler: bool, **kwargs: Any) -> float:
    """Tokens/s of one epoch of a fresh loader (its start included), batch 8, L = 2048; ``sampler``: read through
    torch's DataLoader over the loader's dataset, batch sampler and collate_fn, with ``workers`` workers of torch's."""
    import torch

    import fastload

    start = time.perf_counter()
    with fastload.DataLoader(str(location), batch_size=8, seq_len=2048, num_workers=0 if sampler else workers, seed=1, **kwargs) as loader:
        batches = (torch.utils.data.DataLoader(loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn,
                                               num_workers=workers) if sampler else loader)
        tokens = sum(int(batch["attention_mask"].sum()) for batch in batches)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--text-rounds", type=int, default=None, help="rounds of the text column (default: every round)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="what is read (shards: always, the ratios' base)")
    parser.add_argument("--packings", nargs="+", choices=("concat", "best-fit"), default=["concat", "best-fit"])
    parser.add_argument("--sampler", action="store_true", help="through torch's DataLoader over the loader's batch sampler")
    args = parser.parse_args()
    text_rounds = args.rounds if args.text_rounds is None else args.text_rounds
    out = args.work / "in-place"
    os.environ.setdefault("FASTLOAD_CACHE_DIR", str(out / "cache"))
    if not (out / "ids").exists():
        write_parquet(args.work, out)
    import fastload

    tokenizer = str(args.work / "tokenizer.json")
    every: dict[str, tuple[Path, dict[str, Any]]] = {"shards": (args.work / "tokens", {}), "ids in place": (out / "ids", {}),
                                                     "text in place": (out / "text", {"fields": ["text"], "tokenizer": tokenizer})}
    kinds = {name: every[name] for kind, name in zip(KINDS, every) if kind in args.kinds or kind == "shards"}
    for name, (location, kwargs) in kinds.items():
        start = time.perf_counter()
        fastload.DataLoader(str(location), batch_size=8, seq_len=2048, **kwargs).close()
        print(f"{name}: opened (document table made if missing) in {time.perf_counter() - start:.2f} s", flush=True)
    for packing in args.packings:
        rates: dict[str, list[float]] = {name: [] for name in kinds}
        for round_ in range(args.rounds):
            for name, (location, kwargs) in kinds.items():
                if name != "text in place" or round_ < text_rounds:
                    rates[name].append(epoch(location, args.workers, args.sampler, packing=packing, **kwargs))
        print(packing, {name: f"{statistics.median(v) / 1e6:.1f}M tokens/s ({min(v) / 1e6:.1f}-{max(v) / 1e6:.1f})"
                        for name, v in rates.items() if v}, flush=True)
        print(packing, "in place / shards, each round:", {name: [round(a / b, 2) for a, b in zip(v, rates["shards"])]
                                                          for name, v in rates.items() if name != "shards" and v}, flush=True)


if __name__ == "__main__":
    main()
