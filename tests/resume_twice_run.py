"""One run of the training loop tests/test_resume_twice.py kills and resumes, under torchrun (gloo):
each step it logs what every rank's batch holds (token rows: each segment's position and the ids
delivered there; images: the keys and whether each is real or padding) and every ``--every`` steps
rank 0 saves the loader's state and the step (a JSON file, replaced whole). With ``--hang-at`` the
ranks stop there and wait (each leaving a marker file) to be killed, as a machine dies, a few
steps after the last save; the next run resumes from that save."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import fastload


def batch_record(loader: Any, batch: Any, kind: str, step: int) -> list:
    """What this rank's batch at ``step`` holds, as plain values."""
    if kind == "images":
        return [[key, bool(ok)] for key, ok in zip(batch[2], batch[3].tolist(), strict=True)]
    rows = []
    for r, segments in enumerate(loader.describe(step, 0)):
        row, column = [], 0
        for s in segments:
            row.append([s["shard"], s["document"], s["offset"], batch["input_ids"][r, column : column + s["tokens"]].tolist()])
            column += s["tokens"]
        assert int(batch["attention_mask"][r].sum()) == column, "a row's segments are its tokens"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--kind", choices=["tokens", "images"], required=True)
    parser.add_argument("--packing", default="concat")
    parser.add_argument("--folder", type=Path, required=True, help="the run's folder: its checkpoint and each launch's logs")
    parser.add_argument("--launch", type=int, required=True)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--hang-at", type=int)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.kind == "tokens":
        loader: Any = fastload.DataLoader(args.data, batch_size=8, seq_len=128, block_tokens=4096, packing=args.packing, seed=5,
                                          num_workers=args.workers)
    else:
        loader = fastload.DataLoader(args.data, batch_size=5, shuffle=True, seed=5, evaluation=True, return_keys=True,
                                     transform=[fastload.transforms.CenterCrop(8)], num_workers=args.workers)
    checkpoint = args.folder / "checkpoint.json"
    step = 0
    if checkpoint.exists():
        saved = json.loads(checkpoint.read_text())
        loader.load_state_dict(saved["loader"])
        step = saved["step"]
    with open(args.folder / f"launch{args.launch}-rank{rank}.jsonl", "a") as log:
        for batch in loader:
            log.write(json.dumps({"step": step, "batch": batch_record(loader, batch, args.kind, step)}) + "\n")
            log.flush()
            dist.all_reduce(torch.ones(1))  # as DDP's gradients: every rank has logged this step before any goes on
            step += 1
            if step % args.every == 0 and rank == 0:
                temporary = checkpoint.with_suffix(".tmp")
                temporary.write_text(json.dumps({"step": step, "loader": loader.state_dict()}))
                os.replace(temporary, checkpoint)
            if step == args.hang_at:
                (args.folder / f"hung-{args.launch}-{rank}").touch()
                time.sleep(600)  # killed here
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
