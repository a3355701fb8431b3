"""``fastload describe``'s loader: the options the order depends on, from the command line or a
saved ``state_dict``, made into the loader whose :meth:`~fastload.DataLoader.describe` answers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from fastload.loading.provenance import StepDescription
from fastload.video.clips import Clip


def read_saved_state(path: Path) -> dict[str, Any]:
    """A loader state from a JSON file, or from a torch checkpoint (its dict, or the dict under 'loader')."""
    if path.suffix == ".json":
        state = json.loads(path.read_text())
    else:
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)  # plain values only: no pickle of code
        if isinstance(state, dict) and "version" not in state and isinstance(state.get("loader"), dict):
            state = state["loader"]
    if not isinstance(state, dict) or "samples_consumed" not in state:
        raise ValueError(f"{path}: holds no loader state_dict (saved from loader.state_dict(), or under 'loader')")
    return state


def parse_clip(text: str, sampling: str | None) -> Clip:
    """``FRAMES[:STRIDE[:CLIPS]]`` (``--clip 16:2``) as a Clip."""
    try:
        numbers = [int(part) for part in text.split(":")]
    except ValueError:
        raise ValueError(f"--clip {text}: expected FRAMES[:STRIDE[:CLIPS]], whole numbers") from None
    if not 1 <= len(numbers) <= 3:
        raise ValueError(f"--clip {text}: expected FRAMES[:STRIDE[:CLIPS]]")
    frames, stride, clips = (*numbers, 1, 1)[:3]
    return Clip(frames, stride, clips, sampling)  # type: ignore[arg-type]  # a choice of the command's parser


def describe_from_arguments(args: argparse.Namespace) -> StepDescription:
    """The step ``args`` names, described by a loader made with the options they give."""
    from fastload import transforms as T
    from fastload.loader import DataLoader
    from fastload.storage.dataset import ShardedDataset

    state = read_saved_state(args.state) if args.state is not None else {}
    world = args.world if args.world is not None else int(state.get("world_size", 1))
    batch_size = args.batch_size if args.batch_size is not None else int(state.get("batch_size", 1))
    seed = args.seed if args.seed is not None else int(state.get("seed", 0))
    transform = {"train": T.train(args.size), "val": T.val(args.size), "none": ()}[args.transform]
    dataset: Any = ShardedDataset(args.dataset)
    if args.take is not None:
        import torch

        dataset = torch.utils.data.Subset(dataset, np.loadtxt(args.take, dtype=np.int64, ndmin=1).tolist())
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=args.shuffle, drop_last=args.drop_last, seed=seed,
                        transform=transform, rank=args.rank, world_size=world, shuffle_buffer=args.shuffle_buffer, backend="cpu",
                        exclude=args.exclude, balanced=args.balanced, class_weights=args.class_weights,
                        clip=parse_clip(args.clip, args.sampling) if args.clip else None)
    if state:  # at another --world than the state's: its steps so far ran at the state's topology, the rest at this one
        loader.load_state_dict(state)
    return loader.describe(args.step, args.epoch)
