"""What ``fastload.DataLoader`` asks of a kind of batch: how it counts an epoch and its batches,
makes an epoch's iterator, names a rank's batch at a step, and records and reads its position.

The loader itself keeps what every kind shares: torch's attributes, the training position
(fastload.loading.state), the stats, the epoch in progress, and the ranks' agreement.
To add a kind: a module here with a class of this shape, and the argument that selects it in
``fastload.DataLoader.__init__``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from fastload.loading.epoch import EpochLifecycle
from fastload.orders.position import Position


class BatchKind(Protocol):
    """One kind of batch behind ``fastload.DataLoader`` (samples, packed token rows)."""

    @property
    def backend(self) -> str:
        """What makes the batches: "cpu", "dali-gpu", ..."""
        ...

    @property
    def collate_fn(self) -> Callable[..., Any]:
        """``loader.collate_fn``: what a torch DataLoader of the loader's parts collates with."""
        ...

    def ranks(self) -> tuple[int, int]:
        """(rank, world size), resolved when asked."""
        ...

    def epoch_length(self, epoch: int) -> int:
        """Units (samples, rows) of ``epoch`` from its start: all consumed once it is finished."""
        ...

    def batch_count(self, position: Position) -> int:
        """This rank's batches of the epoch at ``position`` from its start (``len(loader)``)."""
        ...

    def epoch(self, device: torch.device | None, accelerate: bool, before_start: Callable[[], None]) -> EpochLifecycle:
        """An iterator over the next epoch's batches, from the loader's position."""
        ...

    def upcoming_batches(self, position: Position, device: torch.device | None) -> Sequence[list[int]]:
        """This rank's batches from ``position`` as lists of units, each carrying how to make it."""
        ...

    def describe(self, step: int, epoch: int) -> Any:
        """This rank's batch at global ``step`` of ``epoch``, read from indexes only."""
        ...

    def identity(self) -> str:
        """A digest of what is read and how it is cut (recorded in state_dict, compared across ranks)."""
        ...

    def agreement(self) -> dict[str, int | bool]:
        """The settings every rank must share, by argument name."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The loader's position with what this kind needs to resume it."""
        ...

    def read_state(self, state: dict[str, Any]) -> Position:
        """The position ``state`` names, checked against this loader (a clear error where it cannot resume)."""
        ...

    def close(self) -> None:
        """Stop the workers and release what the kind holds."""
        ...
