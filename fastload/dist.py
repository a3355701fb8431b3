"""Rank and world size: explicit arguments, else an initialized torch.distributed process group,
else torchrun's environment (RANK, WORLD_SIZE), else a single process."""

from __future__ import annotations

import os


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
