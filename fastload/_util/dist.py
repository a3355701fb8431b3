"""Rank and world size: explicit arguments, else an initialized torch.distributed process group,
else the launcher's environment, else a single process; sharing bytes that rank 0 read (a remote
index) with the other ranks; and checking that the ranks of a process group agree on a loader."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

import os
import sys
from collections.abc import Callable, Mapping


def resolve_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size) by the precedence above; validates the pair. Called when iteration
    starts, so a loader built before the process group exists (Lightning) is still sharded."""
    if rank is None or world_size is None:
        found_rank, found_world = _discover()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not valid for world_size={world_size}")
    return rank, world_size


def _process_group():
    """torch.distributed when a process group is initialized, else None (torch not imported: none)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist


def _discover() -> tuple[int, int]:
    """From the process group, else RANK/WORLD_SIZE (torchrun), else LOCAL_RANK + WORLD_SIZE with
    the node's rank (Lightning's DDP children have no RANK: NODE_RANK, torchrun's GROUP_RANK)."""
    dist = _process_group()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    if "WORLD_SIZE" not in env:
        return 0, 1
    world = int(env["WORLD_SIZE"])
    if "RANK" in env:
        return int(env["RANK"]), world
    if "LOCAL_RANK" not in env:
        return 0, 1
    local = int(env["LOCAL_RANK"])
    node = int(env.get("NODE_RANK", env.get("GROUP_RANK", "0")))
    if node == 0:
        return local, world
    if "LOCAL_WORLD_SIZE" not in env:
        raise ValueError(
            f"cannot tell this process's global rank: LOCAL_RANK={local} on node {node} without RANK or "
            f"LOCAL_WORLD_SIZE; give rank= and world_size= (or initialize the process group first)"
        )
    return node * int(env["LOCAL_WORLD_SIZE"]) + local, world


def local_rank() -> int:
    """This process's GPU index on its machine (torchrun's LOCAL_RANK, else 0)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def _collective_device(dist) -> torch.device:
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def check_ranks_agree(values: Mapping[str, int], what: str) -> None:
    """With a process group of several ranks, all-gather ``values`` (small ints) and raise naming
    the first one the ranks disagree on; without one, nothing."""
    dist = _process_group()
    if dist is None or dist.get_world_size() == 1:
        return
    import torch

    names = list(values)
    mine = torch.tensor([int(values[name]) for name in names], dtype=torch.int64, device=_collective_device(dist))
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    table = torch.stack(gathered).cpu()
    for column, name in enumerate(names):
        seen = table[:, column].tolist()
        if len(set(seen)) > 1:
            by_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(seen))
            raise ValueError(f"the ranks of the process group disagree on {what}'s {name} ({by_rank}); it must be the same on every rank")


def broadcast_bytes(read: Callable[[], bytes], what: str) -> bytes:
    """``read()`` on rank 0, its bytes sent to every rank when a process group is initialized
    (as a uint8 tensor: nothing is pickled); otherwise just ``read()``."""
    dist = _process_group()
    if dist is None or dist.get_world_size() == 1:
        return read()
    import torch

    device = _collective_device(dist)
    data, error = b"", None
    if dist.get_rank() == 0:
        try:
            data = read()
        except Exception as exc:  # re-raised below, after telling the other ranks
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
