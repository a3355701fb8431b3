"""Train an image classifier with DistributedDataParallel, fed by fastload.

    torchrun --nproc_per_node=2 examples/train_ddp.py --data data/demo/wds --epochs 5
    torchrun --nproc_per_node=2 examples/train_ddp.py --data data/demo/wds --epochs 5 --resume

gloo on the CPU (a small ResNet on small images by default), nccl and bf16 autocast on GPUs.
Every --checkpoint-every steps rank 0 writes model, optimizer and loader state; --resume
continues from it mid-epoch, at any number of processes. Each epoch ends with a validation pass
(evaluation mode: every sample counted once across ranks) and early stopping on its accuracy.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import fastload
from fastload import transforms as T
from fastload._util.dist import local_rank
from fastload.bench.models import MODELS, build_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a converted training dataset")
    p.add_argument("--val-data", help="a converted validation dataset (default: the training data, val transform)")
    p.add_argument("--model", default=None, choices=sorted(MODELS), help="default: resnet50 on GPUs, resnet_small on CPUs")
    p.add_argument("--image-size", type=int, default=None, help="default: 224 on GPUs, 64 on CPUs")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--workers", type=int, default=2, help="loader workers per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from checkpoint-dir/last.pt if it exists")
    p.add_argument("--patience", type=int, default=3, help="epochs without a better val accuracy before stopping")
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


def all_sum(*values: float) -> list[float]:
    """Sum numbers over ranks (on the GPU with nccl, which has no CPU tensors)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.is_initialized() and dist.get_backend() == "nccl" else None
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def save_checkpoint(path: Path, state: dict) -> None:
    """Write atomically: a crash never leaves a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def evaluate(model: torch.nn.Module, loader: fastload.DataLoader, device: torch.device) -> float:
    """Accuracy over the validation set, each sample counted once across ranks."""
    model.eval()
    correct = total = 0.0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for images, labels, valid in loader:
            valid = valid.to(device)
            hits = (model(images).argmax(1) == labels) & valid
            correct += hits.sum().item()
            total += valid.sum().item()
    model.train()
    correct, total = all_sum(correct, total)
    return correct / max(total, 1)


def main() -> None:
    args = parse_args()
    device, rank, world = setup()
    on_gpu = device.type == "cuda"
    size = args.image_size or (224 if on_gpu else 64)
    train_loader = fastload.DataLoader(
        args.data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=args.seed,
        transform=T.train(size, normalize=True), pin_memory=on_gpu, device=device,
    )
    val_loader = fastload.DataLoader(
        args.val_data or args.data, batch_size=args.batch_size, num_workers=args.workers,
        transform=T.val(size, normalize=True), pin_memory=on_gpu, device=device, evaluation=True,
    )
    classes = train_loader.dataset.classes or []
    torch.manual_seed(args.seed)
    model = build_model(args.model or ("resnet50" if on_gpu else "resnet_small"), max(len(classes), 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-5)
    checkpoint_path = args.checkpoint_dir / "last.pt"
    step, best, bad_epochs = 0, -1.0, 0
    if args.resume and checkpoint_path.exists():
        state = torch.load(checkpoint_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        train_loader.load_state_dict(state["loader"])
        step, best, bad_epochs = state["step"], state["best"], state["bad_epochs"]
        if rank == 0:
            print(f"resumed from step {step} (epoch {state['loader']['epoch']}, "
                  f"{state['loader']['samples_consumed']} samples into it)", flush=True)
    ddp = DistributedDataParallel(model) if dist.is_initialized() else model

    def checkpoint() -> None:
        if rank == 0:
            save_checkpoint(checkpoint_path, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "loader": train_loader.state_dict(), "step": step, "best": best, "bad_epochs": bad_epochs,
            })

    start_epoch = train_loader.state_dict()["epoch"]
    for epoch in range(start_epoch, args.epochs):
        train_loader.set_epoch(epoch)
        wait_before, started, images, loss_sum = train_loader.stats.wait_s, time.perf_counter(), 0, torch.zeros((), device=device)
        for batch, labels in train_loader:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                loss = F.cross_entropy(ddp(batch), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            images += len(batch)
            loss_sum += loss.detach() * len(batch)  # a device tensor: no GPU sync each step
            if step % args.checkpoint_every == 0:
                checkpoint()
        seconds = time.perf_counter() - started
        waited = train_loader.stats.wait_s - wait_before
        accuracy = evaluate(ddp, val_loader, device)
        total_images, total_loss, total_wait = all_sum(images, loss_sum.item(), waited)
        if accuracy > best:
            best, bad_epochs = accuracy, 0
        else:
            bad_epochs += 1
        checkpoint()
        if rank == 0:
            print(
                f"epoch {epoch}: loss {total_loss / max(total_images, 1):.3f}  val acc {accuracy:.3f}  "
                f"{total_images / seconds:.0f} images/s  waiting for data {100 * total_wait / world / seconds:.0f}% "
                f"of the time  (step {step})", flush=True,
            )
            print(f"  input: {train_loader.stats.epochs[-1].line()}", flush=True)
        if bad_epochs >= args.patience:
            if rank == 0:
                print(f"early stop: no better val accuracy for {bad_epochs} epochs (best {best:.3f})", flush=True)
            break
    if rank == 0:
        print(f"done: best val acc {best:.3f}", flush=True)
        print(f"rank 0's input pipeline by epoch (loader.stats.summary()):\n{train_loader.stats.summary()}", flush=True)
    train_loader.close()
    val_loader.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
