"""Where training is in an epoch's order: a :class:`Position`, pure data that every order and every
backend reads the same way."""

from __future__ import annotations

from dataclasses import dataclass

ResumedFrom = tuple[int, ...]  # (world size, batch size, samples consumed) when the epoch was left for another topology; the token loader adds its rows' seq_len


@dataclass(frozen=True)
class Position:
    """``consumed`` global samples of ``epoch``'s order, after the topologies the epoch was
    ``resumed_from`` (an elastic resume: the streaming order re-deals the unseen samples after each
    and counts ``consumed`` in the re-dealt order; the global order's positions run on across them)."""

    epoch: int
    consumed: int = 0
    resumed_from: tuple[ResumedFrom, ...] = ()
