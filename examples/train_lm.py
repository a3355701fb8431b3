"""Train a small GPT-style language model with DistributedDataParallel, fed packed token rows by fastload.

    fastload convert corpus/ data/tokens --from jsonl --tokenizer tokenizer.json --append-eos
    torchrun --nproc_per_node=2 examples/train_lm.py --data data/tokens --steps 200
    torchrun --nproc_per_node=2 examples/train_lm.py --data data/tokens --steps 200 --resume

A GPT-2 model made from a config (random weights: nothing is downloaded) with the token dataset's
vocabulary, trained on rows of ``--seq-len`` tokens packed by best-fit decreasing. Each row holds
several documents; they never attend to each other: the loader's ``attention="block-causal"`` adds a
(B, 1, L, L) mask that lets each token see only its own document's tokens up to itself (SDPA
attention; ``attention="varlen"`` with flash-attention), ``position_ids`` restart at each document
(GPT-2's learned positions), and the labels (the next token of the same document) ignore every boundary.
gloo on the CPU, nccl and bf16 autocast on GPUs. Every ``--checkpoint-every`` steps rank 0 writes
model, optimizer and loader state; ``--resume`` continues from it mid-epoch, at any number of
processes, with exactly the tokens an uninterrupted run would have read next. ``--log-batches
FILE`` writes each step's batch digest per rank (what tests/text/test_train_lm.py compares).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2Config, GPT2LMHeadModel

import fastload
from fastload._util.dist import local_rank


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a token dataset (fastload convert ... --tokenizer)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8, help="rows per process")
    p.add_argument("--workers", type=int, default=1, help="loader workers per process")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints-lm"))
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from checkpoint-dir/last.pt if it exists")
    p.add_argument("--log-batches", type=Path, help="append 'step rank digest' of every batch to FILE.RANK")
    return p.parse_args()


def setup() -> tuple[torch.device, int, int]:
    """Join the process group torchrun describes (or run alone); return device, rank, world."""
    cuda = torch.cuda.is_available()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if cuda:
        torch.cuda.set_device(local_rank())
        return torch.device("cuda", local_rank()), rank, world
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    return torch.device("cpu"), rank, world


def save_checkpoint(path: Path, state: dict) -> None:
    """Write atomically: a crash never leaves a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def mean_over_ranks(value: torch.Tensor) -> float:
    """A scalar averaged over the ranks."""
    if dist.is_initialized():
        value = value.clone()
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over the step's real labels on every rank (-100 is padding or a document's end): finite
    for a batch of padding only, and each label weighs the same whatever rank holds it."""
    real = (labels != -100).sum()
    world = 1
    if dist.is_initialized():
        dist.all_reduce(real)
        world = dist.get_world_size()
    loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    return loss * world / real.clamp(min=1)  # DDP averages the ranks' gradients: times world, over the global count


def main() -> None:
    args = parse_args()
    device, rank, _ = setup()
    on_gpu = device.type == "cuda"
    loader = fastload.DataLoader(args.data, batch_size=args.batch_size, seq_len=args.seq_len, packing="best-fit",
                                 attention="block-causal", num_workers=args.workers, seed=args.seed, pin_memory=on_gpu, device=device)
    tokenizer = loader.dataset.index.tokenizer
    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=args.seq_len, n_embd=args.width, n_layer=args.layers,
                        n_head=max(1, args.width // 64), bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
                        attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    checkpoint_path = args.checkpoint_dir / "last.pt"
    step = 0
    if args.resume and checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        if rank == 0:
            print(f"resumed from step {step} (epoch {state['loader']['epoch']}, {state['loader']['samples_consumed']} rows into it)", flush=True)
    ddp = DistributedDataParallel(model) if dist.is_initialized() else model
    log = args.log_batches.with_name(f"{args.log_batches.name}.{rank}").open("a") if args.log_batches else None

    def checkpoint() -> None:
        if rank == 0:
            save_checkpoint(checkpoint_path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                              "loader": loader.state_dict(), "step": step})

    while step < args.steps:
        for batch in loader:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                logits = ddp(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]).logits
            loss = token_loss(logits, batch["labels"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if log is not None:
                digest = hashlib.sha256(batch["input_ids"].cpu().numpy().tobytes()).hexdigest()[:16]
                log.write(f"{step} {rank} {digest}\n")
                log.flush()
            step += 1
            mean_loss = mean_over_ranks(loss.detach())
            if rank == 0 and (step % 10 == 0 or step == 1):
                print(f"step {step}: loss {mean_loss:.3f}  ({loader.stats.tokens} tokens read by rank 0)", flush=True)
            if step % args.checkpoint_every == 0:
                checkpoint()
            if step >= args.steps:
                break
    checkpoint()
    if rank == 0:
        print(f"done: step {step}", flush=True)
        print(f"rank 0's input pipeline by epoch (loader.stats.summary()):\n{loader.stats.summary()}", flush=True)
    loader.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
