"""``fastload describe``'s loader: the options the order depends on, from the command line or a
saved ``state_dict``, made into the loader whose :meth:`~fastload.DataLoader.describe` answers."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastload.loading.provenance import StepDescription
from fastload.media import MEDIA_ROLES


def read_saved_state(path: Path) -> dict[str, Any]:
    """A loader state from a JSON file, or from a torch checkpoint (its dict, or the dict under 'loader')."""
    if path.suffix == ".json":
        try:
            state = json.loads(path.read_bytes())
        except ValueError as exc:  # bad JSON or UTF-8: the decoder names the place, never the text
            raise ValueError(f"{path}: not JSON ({str(exc)[:80]})") from None
    else:
        import torch

        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # plain values only: no pickle of code
        except OSError:
            raise
        except Exception as exc:  # torch raises many kinds for a file that is not a checkpoint (UnpicklingError, RuntimeError, ...)
            raise ValueError(f"{path}: not a torch checkpoint that holds only plain values ({type(exc).__name__})") from None
        if isinstance(state, dict) and "version" not in state and isinstance(state.get("loader"), dict):
            state = state["loader"]
    if not isinstance(state, dict) or "samples_consumed" not in state:
        raise ValueError(f"{path}: holds no loader state_dict (saved from loader.state_dict(), or under 'loader')")
    return state


def read_take(path: Path) -> list[int]:
    """``--take``'s sample indices: a text file of whole numbers, one a line."""
    try:
        return np.loadtxt(path, dtype=np.int64, ndmin=1).tolist()
    except ValueError:
        raise ValueError(f"{path}: --take needs whole numbers (sample indices), one a line") from None


# options no token loader has (each media role's sampling among them: --clip, --audio)
IMAGE_ONLY = ("take", "exclude", "balanced", "class_weights", *(media.keyword for media in MEDIA_ROLES.values()), "shuffle_buffer")
TOKEN_ONLY = ("seq_len", "packing", "block_tokens", "packing_window")  # the token loader's, which its rows depend on
IN_PLACE_TOKENS = ("field", "tokenizer")  # the token loader's over data read in place: the column and its tokenizer


@dataclass(frozen=True)
class TokenStepDescription:
    """A token loader's batch at a step: each row's segments (shard, document, first token in it, tokens)."""

    epoch: int
    step: int
    rank: int
    world_size: int
    batch_size: int
    seq_len: int
    rows: list[list[dict[str, Any]]]

    def as_dict(self) -> dict[str, Any]:
        """The description as plain values (``--json``)."""
        return asdict(self)


def describe_from_arguments(args: argparse.Namespace) -> StepDescription | TokenStepDescription:
    """The step ``args`` names, described by a loader made with the options they give."""
    from fastload import transforms as T
    from fastload.loader import DataLoader
    from fastload.storage.dataset import ShardedDataset

    state = read_saved_state(args.state) if args.state is not None else {}
    try:
        world = args.world if args.world is not None else int(state.get("world_size", 1))
        batch_size = args.batch_size if args.batch_size is not None else int(state.get("batch_size", 1))
        seed = args.seed if args.seed is not None else int(state.get("seed", 0))
    except (TypeError, ValueError):
        raise ValueError(f"{args.state}: its world_size, batch_size and seed must be whole numbers") from None
    dataset: Any = ShardedDataset(args.dataset)
    if dataset.index.tokenizer is not None or (dataset.layout.in_place and args.seq_len is not None):  # in place: a column's token rows
        return describe_tokens(args, dataset, state, world, batch_size, seed)
    given = [option(name) for name in (*TOKEN_ONLY, *IN_PLACE_TOKENS) if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: options of a token dataset's rows, and {dataset.location} holds no tokens")
    media = {media.keyword: media.option.parse(getattr(args, media.keyword), args.sampling)
             for media in MEDIA_ROLES.values() if getattr(args, media.keyword)}
    sound = any(not media.images and getattr(args, media.keyword) for media in MEDIA_ROLES.values())  # crops of sound: no geometry
    transform = () if sound else {"train": T.train(args.size), "val": T.val(args.size), "none": ()}[args.transform]
    if args.take is not None:
        import torch

        dataset = torch.utils.data.Subset(dataset, read_take(args.take))
    quiet = logging.getLogger("fastload")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the loader's note on its backend (the CPU, always) is not the answer
    try:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=args.shuffle, drop_last=args.drop_last, seed=seed,
                            transform=transform, rank=args.rank, world_size=world, shuffle_buffer=args.shuffle_buffer, backend="cpu",
                            exclude=args.exclude, balanced=args.balanced, class_weights=args.class_weights, **media)
    finally:
        quiet.setLevel(level)
    if state:  # at another --world than the state's: its steps so far ran at the state's topology, the rest at this one
        loader.load_state_dict(state)
    return loader.describe(args.step, args.epoch)


def option(name: str) -> str:
    """The command-line spelling of the argument ``name`` (``--seq-len``)."""
    return "--" + name.replace("_", "-")


def describe_tokens(args: argparse.Namespace, dataset: Any, state: dict[str, Any], world: int, batch_size: int,
                    seed: int) -> TokenStepDescription:
    """The token loader's batch at the step ``args`` names: its rows' segments, with the rows'
    options (``--seq-len``, required, and ``--packing``, ``--block-tokens``, ``--packing-window``; data read in
    place: ``--field``, ``--tokenizer``) given."""
    from fastload.loader import DataLoader

    given = [option(name) for name in IMAGE_ONLY if getattr(args, name) not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)}: not options of a token dataset's loader ({dataset.location} holds tokens)")
    if args.seq_len is None:
        raise ValueError(f"{dataset.location} holds tokens: give --seq-len (the loader's seq_len=), and --packing, --block-tokens "
                         "and --packing-window where the loader had other than their defaults")
    rows = {name: getattr(args, name) for name in TOKEN_ONLY[1:] if getattr(args, name) is not None}
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=args.shuffle, drop_last=args.drop_last, seq_len=args.seq_len,
                        seed=seed, rank=args.rank, world_size=world, fields=None if args.field is None else [args.field],
                        tokenizer=args.tokenizer, **rows)
    if state:
        loader.load_state_dict(state)
    epoch = args.epoch if args.epoch is not None else loader.state.current_epoch
    return TokenStepDescription(epoch, args.step, args.rank, world, batch_size, args.seq_len, loader.describe(args.step, epoch))
