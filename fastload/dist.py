"""Rank and world size: explicit arguments, else an initialized torch.distributed process group,
else torchrun's environment (RANK, WORLD_SIZE), else a single process; and sharing bytes that
rank 0 read (a remote index) with the other ranks."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def resolve_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size) by the precedence above; validates the pair."""
    if rank is None or world_size is None:
        found_rank, found_world = _discover()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not valid for world_size={world_size}")
    return rank, world_size


def _discover() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1


def local_rank() -> int:
    """This process's GPU index on its machine (torchrun's LOCAL_RANK, else 0)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def broadcast_bytes(read: Callable[[], bytes], what: str) -> bytes:
    """``read()`` on rank 0, its bytes sent to every rank when a process group is initialized
    (as a uint8 tensor: nothing is pickled); otherwise just ``read()``."""
    dist = sys.modules.get("torch.distributed")  # no torch imported: no process group (and no import cost)
    if dist is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return read()
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    data, error = b"", None
    if dist.get_rank() == 0:
        try:
            data = read()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after telling the other ranks
            error = exc
    length = torch.tensor([-1 if error else len(data)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    if error is not None:
        raise error
    if length.item() < 0:
        raise RuntimeError(f"rank 0 could not read {what}; see its error")
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(int(length.item()), dtype=torch.uint8)
    buffer = buffer.to(device)
    dist.broadcast(buffer, src=0)
    return bytes(buffer.cpu().numpy())
